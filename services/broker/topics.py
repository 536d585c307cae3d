"""Topic configurations of one broker, persisted as ``{store}/config/topics.json``.

State only, no gRPC: create, update, delete, look up; every change bumps the data version (what
the broker registers with the nameservers) and is written atomically before it is answered.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field

from tidemq.protos import common_pb2
from tidemq.storage import state_file
from tidemq.storage.archive.config import POLICIES
from tidemq.storage.atomic_file import write_json_atomic
from tidemq.storage.clock import now_ms
from tidemq.storage.errors import StoreError
from tidemq.storage.record import validate_topic

# Permission bits: the wire's Permission enum.
PERM_READ = common_pb2.PERM_READ
PERM_WRITE = common_pb2.PERM_WRITE
PERM_RW = PERM_READ | PERM_WRITE
MAX_QUEUES = 1024
# RocketMQ's AUTO_CREATE_TOPIC_KEY_TOPIC. A broker that creates topics on first send registers
# this route, so a producer asking for a topic no nameserver knows yet learns which brokers would
# accept it (and with how many queues) instead of failing with ROUTE_NOT_FOUND.
AUTO_CREATE_TOPIC = "TBW102"
# A topic's own retention policy (docs/archive.md), overriding the archive's default.
RETENTION_POLICY_ATTRIBUTE = "retention.policy"


@dataclass
class TopicConfig:
    topic: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_RW
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        validate_topic(self.topic)
        for name in ("read_queue_nums", "write_queue_nums"):
            n = getattr(self, name)
            if not 1 <= n <= MAX_QUEUES:
                raise ValueError(f"{name} must be 1..{MAX_QUEUES}, got {n}")
        if self.perm & ~(PERM_RW | common_pb2.PERM_INHERIT) or self.perm < 0:
            raise ValueError(f"perm {self.perm} is not a combination of 4 (read), 2 (write), 1")
        policy = self.attributes.get(RETENTION_POLICY_ATTRIBUTE)
        if policy is not None and policy not in POLICIES:
            raise ValueError(
                f"attribute {RETENTION_POLICY_ATTRIBUTE} must be one of {POLICIES}, got {policy!r}"
            )


@dataclass
class DataVersion:
    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = 0

    def bump(self) -> None:
        self.counter += 1
        self.timestamp_ms = now_ms()


FILE_NAME = "topics.json"


@dataclass(frozen=True)
class TopicsFile:
    """The shape of topics.json."""

    topics: list[TopicConfig]
    data_version: DataVersion = field(default_factory=DataVersion)

    def __post_init__(self) -> None:
        for i, t in enumerate(self.topics):
            try:
                t.validate()
            except (ValueError, StoreError) as e:
                raise ValueError(f"wrong shape: 'topics'[{i}] ({t.topic!r}): {e}") from None


def fix_hint(store_dir: str) -> str:
    return (
        f"`tidemq broker repair-state --store {store_dir} --from-peer HOST:PORT` copies the "
        f"topics of a running broker of the group, or `--reset topics` rebuilds them from the "
        f"queues in the store (8 queues or the highest seen; permissions and attributes lost); "
        f"either keeps the bad file as {FILE_NAME}.corrupt-<time>"
    )


def load_topics(store_dir: str) -> TopicsFile | None:
    """The stored topics (None when none were ever written); StateFileError when damaged."""
    path = os.path.join(store_dir, "config", FILE_NAME)
    return state_file.load(path, TopicsFile, fix_hint(store_dir))


class TopicManager:
    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self._lock = threading.Lock()
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        stored = load_topics(store_dir)
        if stored is not None:
            self.topics = {t.topic: t for t in stored.topics}
            self.data_version = stored.data_version

    def _persist(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(
            self.path,
            {
                "topics": [asdict(t) for t in sorted(self.topics.values(), key=lambda t: t.topic)],
                "data_version": asdict(self.data_version),
            },
        )

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def upsert(self, cfg: TopicConfig) -> bool:
        """Create or update; returns True when created. Raises ValueError on a bad config."""
        cfg.validate()
        with self._lock:
            created = cfg.topic not in self.topics
            if not created and self.topics[cfg.topic] == cfg:
                return False
            self.topics = {**self.topics, cfg.topic: cfg}
            self.data_version.bump()
            self._persist()
            return created

    def delete(self, topic: str) -> bool:
        with self._lock:
            if topic not in self.topics:
                return False
            self.topics = {k: v for k, v in self.topics.items() if k != topic}
            self.data_version.bump()
            self._persist()
            return True

    def set_auto_create(self, enabled: bool, queue_nums: int) -> None:
        """Keep the AUTO_CREATE_TOPIC route in step with the broker's setting (it is persisted
        with the other topics, so turning the setting off must remove it too)."""
        if enabled:
            self.upsert(TopicConfig(AUTO_CREATE_TOPIC, queue_nums, queue_nums))
        else:
            self.delete(AUTO_CREATE_TOPIC)

    def replace_all(self, topics: list[TopicConfig], version: DataVersion) -> bool:
        """Config sync on a slave: the master's topics and data version, as they are (the master
        validated them); returns whether anything changed."""
        table = {t.topic: t for t in topics}
        with self._lock:
            if table == self.topics and version == self.data_version:
                return False
            self.topics = table
            self.data_version = DataVersion(**asdict(version))
            self._persist()
            return True

    def all(self) -> list[TopicConfig]:
        return sorted(self.topics.values(), key=lambda t: t.topic)
