"""Topic configurations of one broker, persisted as ``{store}/config/topics.json`` (a snapshot)
plus ``topics.json.journal`` (the changes since; ``journaled_table`` has the format).

State only: create, update, delete, look up; every change bumps the data version (what the
broker registers with the nameservers) and is journaled (one fsync'd append, not a rewrite of
every topic) before it is answered. Creating a topic past ``max_topics`` raises
``LimitExceededError`` and changes nothing.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tidemq.protos import common_pb2
from tidemq.services.broker import data_version, state_journal
from tidemq.services.broker.journaled_table import JournaledTable, journal_path, replay
from tidemq.services.broker.limits import DEFAULT_MAX_TOPICS, too_many_topics
from tidemq.storage import state_file
from tidemq.storage.archive.config import POLICIES
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


# Where registrations, config sync and groups have always found it.
DataVersion = data_version.DataVersion

FILE_NAME = "topics.json"
JOURNAL_NAME = FILE_NAME + ".journal"
# How many topic changes the broker remembers for incremental registrations and config sync. A
# reader further behind than this (a nameserver down for a long while) gets everything again.
CHANGE_LOG_ENTRIES = 100_000


@dataclass(frozen=True)
class TopicChanges:
    """What changed in a topic table after some data version, and the version it leads to."""

    upserted: list[TopicConfig]  # created or updated, as they are now
    removed: list[str]  # deleted (and not created again since)
    data_version: DataVersion


@dataclass(frozen=True)
class TopicsFile:
    """The shape of topics.json."""

    topics: list[TopicConfig]
    data_version: DataVersion = field(default_factory=DataVersion)
    # The last journal record the snapshot holds (absent in files older than the journal).
    journal_seq: int = 0

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
        f"either keeps the bad files as {FILE_NAME}[.journal].corrupt-<time>"
    )


def _topic_of(value: Any, where: str = "'put'") -> TopicConfig:
    """A stored topic, checked as ``state_file.from_json`` checks it. The common case is built
    directly: the generic conversion costs ~0.1 ms a topic, seconds at 100,000 topics."""
    cfg: TopicConfig | None = None
    if type(value) is dict and value.keys() <= _FIELDS and type(value.get("topic")) is str:
        cfg = TopicConfig(**value)
        attrs = cfg.attributes
        if not (
            type(cfg.read_queue_nums) is int
            and type(cfg.write_queue_nums) is int
            and type(cfg.perm) is int
            and type(cfg.order) is bool
            and type(attrs) is dict
            and all(type(k) is str and type(v) is str for k, v in attrs.items())
        ):
            cfg = None
    if cfg is None:
        cfg = state_file.from_json(TopicConfig, value, where)
    try:
        cfg.validate()
    except (ValueError, StoreError) as e:
        raise ValueError(f"wrong shape: {where} ({cfg.topic!r}): {e}") from None
    return cfg


_FIELDS = frozenset(f.name for f in fields(TopicConfig))


@dataclass(frozen=True)
class _Snapshot:
    """topics.json as the broker reads it: ``TopicsFile``'s shape, its topics built by
    ``_topic_of``."""

    topics: list[Any]
    data_version: DataVersion = field(default_factory=DataVersion)
    journal_seq: int = 0

    def __post_init__(self) -> None:
        configs = [_topic_of(t, f"'topics'[{i}]") for i, t in enumerate(self.topics)]
        object.__setattr__(self, "topics", configs)


@dataclass
class _Loaded:
    table: dict[str, TopicConfig]
    version: DataVersion
    seq: int
    read: state_journal.Replay
    found: bool  # a snapshot or a journal record existed


def _load(store_dir: str) -> _Loaded:
    path = os.path.join(store_dir, "config", FILE_NAME)
    fix = fix_hint(store_dir)
    stored = state_file.load(path, _Snapshot, fix)
    base = stored or _Snapshot([])
    table = {t.topic: t for t in base.topics}
    read, version, seq = replay(
        path, fix, table, replace(base.data_version), base.journal_seq, _topic_of, _name
    )
    return _Loaded(table, version, seq, read, stored is not None or bool(read.records))


def load_topics(store_dir: str) -> TopicsFile | None:
    """The stored topics, snapshot and journal (None when none were ever written);
    StateFileError when damaged."""
    loaded = _load(store_dir)
    if not loaded.found:
        return None
    topics = sorted(loaded.table.values(), key=_name)
    return TopicsFile(topics, loaded.version, loaded.seq)


def _name(t: TopicConfig) -> str:
    return t.topic


class TopicManager:
    def __init__(self, store_dir: str, *, max_topics: int = DEFAULT_MAX_TOPICS) -> None:
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self.max_topics = max_topics
        self._lock = threading.Lock()
        loaded = _load(store_dir)
        self._table: JournaledTable[TopicConfig] = JournaledTable(
            self.path,
            fix_hint(store_dir),
            "topics",
            loaded.table,
            loaded.version,
            loaded.seq,
            loaded.read,
            _name,
            asdict,
            CHANGE_LOG_ENTRIES,
        )

    # The table and its version are the journaled table's; tests and registrations read them.
    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self._table.items

    @topics.setter
    def topics(self, table: dict[str, TopicConfig]) -> None:
        self._table.items = table

    @property
    def data_version(self) -> DataVersion:
        return self._table.version

    @data_version.setter
    def data_version(self, version: DataVersion) -> None:
        self._table.version = version

    @property
    def journal_path(self) -> str:
        return journal_path(self.path)

    @property
    def bytes_written(self) -> int:
        """Journal and snapshot bytes written since start (scale tests measure it)."""
        return self._table.bytes_written

    def _changed(self, topic: str) -> None:
        """Record (bump, log, journal) a change already made to ``topics``."""
        cfg = self.topics.get(topic)
        self._table.change([cfg] if cfg is not None else [], [] if cfg is not None else [topic])

    def had_version(self, version: DataVersion) -> bool:
        """Whether ``version`` (counter and timestamp) is one this table had, as far as the
        change log reaches: config sync answers changes only to a slave at such a version."""
        with self._lock:
            return self._table.had(version)

    def changes_since(self, version: DataVersion) -> TopicChanges | None:
        """The changes after ``version``, or None when they are not all known (another state
        version, a version ahead of this table's, or older than the change log): the caller
        then takes the whole table."""
        with self._lock:
            found = self._table.changes_since(version)
            if found is None:
                return None
            return TopicChanges(found[0], found[1], replace(self.data_version))

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def upsert(self, cfg: TopicConfig) -> bool:
        """Create or update; returns True when created. Raises ValueError on a bad config,
        LimitExceededError when creating it would pass ``max_topics``."""
        cfg.validate()
        with self._lock:
            created = cfg.topic not in self.topics
            if not created and self.topics[cfg.topic] == cfg:
                return False
            if created and len(self.topics) >= self.max_topics:
                raise too_many_topics(cfg.topic, self.max_topics)
            self._table.change([cfg])
            return created

    def delete(self, topic: str) -> bool:
        with self._lock:
            if topic not in self.topics:
                return False
            self._table.change(dels=[topic])
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
            self._table.replace_all(table, version)
            return True

    def apply_changes(self, changes: TopicChanges, since: DataVersion) -> bool | None:
        """Config sync on a slave: the master's changes after ``since`` (the version this slave
        asked with). Returns whether a topic changed; None when this table is no longer at
        ``since`` (nothing applied: the next sync brings what fits). The data version becomes
        the master's exactly, as with ``replace_all``. No limit applies: a slave holds what its
        master holds."""
        with self._lock:
            return self._table.apply_changes(
                changes.upserted, changes.removed, since, changes.data_version
            )

    def all(self) -> list[TopicConfig]:
        with self._lock:  # changes mutate the table in place
            configs = list(self.topics.values())
        return sorted(configs, key=lambda t: t.topic)

    def close(self) -> None:
        self._table.close()
