"""Subscription groups: the durable record of every consumer group a broker has served,
persisted as ``{store}/config/subscriptionGroup.json`` (RocketMQ's subscriptionGroup.json).

Members come and go (``clients.py`` holds who is alive); the group stays: its consume mode, the
topics its members subscribed to, when it first appeared. A slave copies the table from its
master (config sync), so after a failover the group is known where its consumers arrive.

A change is written atomically before the heartbeat that caused it is answered. Only real
changes write: a group's topics only grow (members of one group disagreeing on subscriptions
cannot make the table flap), and a mode change is a change.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from tidemq.services.broker.topics import DataVersion
from tidemq.storage import state_file
from tidemq.storage.atomic_file import write_json_atomic

FILE_NAME = "subscriptionGroup.json"


@dataclass(frozen=True)
class SubscriptionGroup:
    group: str
    mode: int  # broker.proto ConsumeMode
    topics: tuple[str, ...] = ()
    created_ms: int = 0


@dataclass(frozen=True)
class GroupsFile:
    """The shape of subscriptionGroup.json."""

    groups: list[SubscriptionGroup]
    data_version: DataVersion = field(default_factory=DataVersion)


def fix_hint(store_dir: str) -> str:
    return (
        f"`tidemq broker repair-state --store {store_dir} --from-peer HOST:PORT` copies the "
        f"groups of a running broker of the group, or `--reset groups` starts with none (each "
        f"group is recorded again at its consumers' next heartbeat); either keeps the bad file "
        f"as {FILE_NAME}.corrupt-<time>"
    )


def load_groups(store_dir: str) -> GroupsFile | None:
    """The stored groups (None when none were ever written); StateFileError when damaged."""
    path = os.path.join(store_dir, "config", FILE_NAME)
    return state_file.load(path, GroupsFile, fix_hint(store_dir))


@dataclass
class SubscriptionGroupManager:
    store_dir: str
    groups: dict[str, SubscriptionGroup] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)

    def __post_init__(self) -> None:
        self.path = os.path.join(self.store_dir, "config", FILE_NAME)
        self._lock = threading.Lock()
        stored = load_groups(self.store_dir)
        if stored is not None:
            self.groups = {g.group: g for g in stored.groups}
            self.data_version = stored.data_version

    def observe(self, group: str, mode: int, topics: Iterable[str], now_ms: int) -> bool:
        """A heartbeat's membership; returns whether the table changed (and was written)."""
        with self._lock:
            old = self.groups.get(group)
            merged = tuple(sorted(set(topics) | set(old.topics if old else ())))
            new = SubscriptionGroup(group, mode, merged, old.created_ms if old else now_ms)
            if new == old:
                return False
            self.groups = {**self.groups, group: new}
            self.data_version.bump()
            self._persist()
            return True

    def replace_all(self, groups: Iterable[SubscriptionGroup], version: DataVersion) -> bool:
        """Config sync: the master's table and version; returns whether anything changed."""
        table = {g.group: g for g in groups}
        with self._lock:
            if table == self.groups and version == self.data_version:
                return False
            self.groups = table
            self.data_version = DataVersion(**asdict(version))
            self._persist()
            return True

    def all(self) -> list[SubscriptionGroup]:
        return sorted(self.groups.values(), key=lambda g: g.group)

    def _persist(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(
            self.path,
            {
                "groups": [asdict(g) for g in self.all()],
                "data_version": asdict(self.data_version),
            },
        )
