"""Subscription groups: the durable record of every consumer group a broker has served,
persisted as ``{store}/config/subscriptionGroup.json`` (RocketMQ's subscriptionGroup.json).

Members come and go (``clients.py`` holds who is alive); the group stays: its consume mode, the
topics its members subscribed to, when it first appeared, its consume model and its settings. A
slave copies the table from its master (config sync), so after a failover the group is known
where its consumers arrive, with the settings an operator gave it.

The **consume model** (OFFSETS: pull and commit; RECEIVE: receive and ack each message) is fixed
by the group's first use: a heartbeat (whose model UNSPECIFIED, from clients older than
receive/ack, counts as OFFSETS) or a receive. A call of the other model is refused with
CONSUME_MODEL_MISMATCH until an operator changes the model (``update``). The **settings** (max
delivery attempts, retry policy, FIFO, consume enabled) matter to receive groups; a group gets
the defaults when it is created, and files written before they existed load with them.

A change is journaled (one fsync'd append to ``subscriptionGroup.json.journal``; the format is
``journaled_table``'s) before the call that caused it is answered. Only real changes write: a
group's topics only grow (members of one group disagreeing on subscriptions cannot make the
table flap), and a mode, model or settings change is a change. Only the master writes; a
slave's table is its master's (``replace_all``, or ``apply_changes`` with what changed).
Creating a group past ``max_groups`` raises ``LimitExceededError`` and changes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tidemq.protos import broker_pb2
from tidemq.services.broker import state_journal
from tidemq.services.broker.journaled_table import JournaledTable, journal_path
from tidemq.services.broker.journaled_table import replay as replay_journal
from tidemq.services.broker.limits import DEFAULT_MAX_GROUPS, too_many_groups
from tidemq.services.broker.receive.dead_letter import dlq_topic_problem
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.topics import DataVersion
from tidemq.services.errors import invalid, model_mismatch
from tidemq.storage import state_file

log = logging.getLogger(__name__)

FILE_NAME = "subscriptionGroup.json"
JOURNAL_NAME = FILE_NAME + ".journal"
# Group changes remembered for incremental config sync; a slave further behind gets them all.
CHANGE_LOG_ENTRIES = 20_000

DEFAULT_MAX_DELIVERY_ATTEMPTS = 16
MAX_DELIVERY_ATTEMPTS_LIMIT = 1000
UNSPECIFIED = broker_pb2.CONSUME_MODEL_UNSPECIFIED
OFFSETS = broker_pb2.OFFSETS
RECEIVE = broker_pb2.RECEIVE
MODELS = (OFFSETS, RECEIVE)


@dataclass(frozen=True)
class GroupSettings:
    """A receive group's settings (RocketMQ's subscription group config); validated here."""

    # After this many deliveries a message that fails again goes to %DLQ%<group>.
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    # FIFO message groups: a message waits for every earlier one of its message group.
    fifo: bool = False
    # False: receives answer CONSUME_DISABLED (an operator paused the group).
    consume_enabled: bool = True

    def __post_init__(self) -> None:
        attempts = self.max_delivery_attempts
        if not 1 <= attempts <= MAX_DELIVERY_ATTEMPTS_LIMIT:
            raise ValueError(
                f"max_delivery_attempts must be 1..{MAX_DELIVERY_ATTEMPTS_LIMIT}, got {attempts}"
            )


@dataclass(frozen=True)
class SubscriptionGroup:
    group: str
    mode: int  # broker.proto ConsumeMode
    topics: tuple[str, ...] = ()
    created_ms: int = 0
    model: int = UNSPECIFIED  # broker.proto ConsumeModel; UNSPECIFIED until the first use
    settings: GroupSettings = field(default_factory=GroupSettings)


@dataclass(frozen=True)
class GroupsFile:
    """The shape of subscriptionGroup.json."""

    groups: list[SubscriptionGroup]
    data_version: DataVersion = field(default_factory=DataVersion)
    # The last journal record the snapshot holds (absent in files older than the journal).
    journal_seq: int = 0


@dataclass(frozen=True)
class GroupChanges:
    """What changed in the group table after some data version, and the version it leads to."""

    upserted: list[SubscriptionGroup]
    removed: list[str]
    data_version: DataVersion


def fix_hint(store_dir: str) -> str:
    return (
        f"`tidemq broker repair-state --store {store_dir} --from-peer HOST:PORT` copies the "
        f"groups of a running broker of the group, or `--reset groups` starts with none (each "
        f"group is recorded again at its consumers' next heartbeat, with default settings); "
        f"either keeps the bad files as {FILE_NAME}[.journal].corrupt-<time>"
    )


def _group_of_json(value: Any) -> SubscriptionGroup:
    return state_file.from_json(SubscriptionGroup, value, "'put'")


def _name(g: SubscriptionGroup) -> str:
    return g.group


def _load(store_dir: str) -> tuple[GroupsFile, state_journal.Replay, bool]:
    """Snapshot plus journal: (the table, the replay, whether anything was stored)."""
    path = os.path.join(store_dir, "config", FILE_NAME)
    fix = fix_hint(store_dir)
    stored = state_file.load(path, GroupsFile, fix)
    base = stored or GroupsFile([])
    table = {g.group: g for g in base.groups}
    read, version, seq = replay_journal(
        path, fix, table, replace(base.data_version), base.journal_seq, _group_of_json, _name
    )
    found = stored is not None or bool(read.records)
    return GroupsFile(sorted(table.values(), key=_name), version, seq), read, found


def load_groups(store_dir: str) -> GroupsFile | None:
    """The stored groups, snapshot and journal (None when none were ever written);
    StateFileError when damaged."""
    stored, _, found = _load(store_dir)
    return stored if found else None


def _model(model: int) -> int:
    """A caller's model: UNSPECIFIED (a client older than receive/ack) is OFFSETS."""
    return model or OFFSETS


class SubscriptionGroupManager:
    def __init__(self, store_dir: str, *, max_groups: int = DEFAULT_MAX_GROUPS) -> None:
        self.store_dir = store_dir
        self.max_groups = max_groups
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self._lock = threading.Lock()
        stored, read, _ = _load(store_dir)
        self._table: JournaledTable[SubscriptionGroup] = JournaledTable(
            self.path,
            fix_hint(store_dir),
            "groups",
            {g.group: g for g in stored.groups},
            stored.data_version,
            stored.journal_seq,
            read,
            _name,
            asdict,
            CHANGE_LOG_ENTRIES,
        )

    @property
    def groups(self) -> dict[str, SubscriptionGroup]:
        return self._table.items

    @property
    def data_version(self) -> DataVersion:
        return self._table.version

    @property
    def journal_path(self) -> str:
        return journal_path(self.path)

    @property
    def bytes_written(self) -> int:
        return self._table.bytes_written

    def get(self, group: str) -> SubscriptionGroup | None:
        return self.groups.get(group)

    def check_model(self, group: str, model: int) -> None:
        """Refuse a call of ``model`` on ``group`` when the group uses the other one
        (CONSUME_MODEL_MISMATCH), or a receive group whose name no dead-letter topic can carry
        (INVALID_ARGUMENT). Changes nothing: slaves check too."""
        model = _model(model)
        old = self.groups.get(group)
        if old is not None and old.model == model:
            return
        if old is not None and old.model != UNSPECIFIED:
            raise model_mismatch(group, old.model, model)
        if model == RECEIVE:
            problem = dlq_topic_problem(group)
            if problem is not None:
                raise invalid(problem)

    def use_model(
        self, group: str, model: int, now_ms: int, *, topics: Iterable[str] = ()
    ) -> SubscriptionGroup:
        """The group as a call of ``model`` on ``topics`` finds it: created with the default
        settings when unknown, its model fixed by this first use, the topics added; persisted
        when that changed anything. A group of the other model raises CONSUME_MODEL_MISMATCH."""
        model = _model(model)
        old = self.groups.get(group)
        # The common case, every receive: nothing to change, nothing to lock.
        if old is not None and old.model == model and all(t in old.topics for t in topics):
            return old
        with self._lock:
            self.check_model(group, model)
            old = self.groups.get(group)
            if old is None:
                new = SubscriptionGroup(group, 0, tuple(sorted(set(topics))), now_ms, model)
            else:
                merged = tuple(sorted(set(topics) | set(old.topics)))
                new = replace(old, topics=merged, model=model)
            if new != old:
                self._put(new, created=old is None)
            return new

    def observe(
        self, group: str, mode: int, topics: Iterable[str], now_ms: int, model: int = OFFSETS
    ) -> bool:
        """A heartbeat's membership; returns whether the table changed (and was written). The
        membership's model must be the group's (CONSUME_MODEL_MISMATCH), or fixes it."""
        model = _model(model)
        with self._lock:
            self.check_model(group, model)
            old = self.groups.get(group)
            merged = tuple(sorted(set(topics) | set(old.topics if old else ())))
            if old is None:
                new = SubscriptionGroup(group, mode, merged, now_ms, model)
            else:
                new = replace(old, mode=mode, topics=merged, model=model)
            if new == old:
                return False
            self._put(new, created=old is None)
            return True

    def update(
        self,
        group: str,
        *,
        max_delivery_attempts: int | None = None,
        retry_policy: RetryPolicy | None = None,
        fifo: bool | None = None,
        consume_enabled: bool | None = None,
        model: int | None = None,
        now_ms: int,
    ) -> SubscriptionGroup:
        """An operator's change of the named fields (None: leave it); a group that does not
        exist is created with the defaults first. A model change is how a group moves from one
        model to the other. Raises ValueError on a bad value, changing nothing."""
        if model is not None and model not in MODELS:
            raise ValueError(
                f"model must be OFFSETS ({OFFSETS}) or RECEIVE ({RECEIVE}), got {model}"
            )
        if model == RECEIVE:
            problem = dlq_topic_problem(group)
            if problem is not None:
                raise ValueError(problem)
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("max_delivery_attempts", max_delivery_attempts),
                ("retry_policy", retry_policy),
                ("fifo", fifo),
                ("consume_enabled", consume_enabled),
            )
            if value is not None
        }
        with self._lock:
            known = self.groups.get(group)
            old = known or SubscriptionGroup(group, 0, (), now_ms)
            new = replace(
                old,
                settings=replace(old.settings, **changes),  # validates: ValueError
                model=old.model if model is None else model,
            )
            if new != known:
                self._put(new, created=known is None)
            return new

    def delete(self, group: str) -> bool:
        """Forget the group (its settings and model); False when it was not known. Its members'
        next heartbeat records it again, with the defaults."""
        with self._lock:
            if group not in self.groups:
                return False
            self._table.change(dels=[group])
            return True

    def had_version(self, version: DataVersion) -> bool:
        """Whether ``version`` (counter and timestamp) is one this table had, as far as the
        change log reaches: config sync answers changes only to a slave at such a version."""
        with self._lock:
            return self._table.had(version)

    def changes_since(self, version: DataVersion) -> GroupChanges | None:
        """The changes after ``version``; None when not all known (the caller takes all)."""
        with self._lock:
            found = self._table.changes_since(version)
            if found is None:
                return None
            return GroupChanges(found[0], found[1], replace(self.data_version))

    def replace_all(self, groups: Iterable[SubscriptionGroup], version: DataVersion) -> bool:
        """Config sync: the master's table and version; returns whether anything changed."""
        table = {g.group: g for g in groups}
        with self._lock:
            if table == self.groups and version == self.data_version:
                return False
            self._table.replace_all(table, version)
            return True

    def apply_changes(self, changes: GroupChanges, since: DataVersion) -> bool | None:
        """Config sync: the master's changes after ``since`` (see ``TopicManager.apply_changes``);
        None when this table is no longer at ``since``. No limit applies on a slave."""
        with self._lock:
            return self._table.apply_changes(
                list(changes.upserted), changes.removed, since, changes.data_version
            )

    def all(self) -> list[SubscriptionGroup]:
        with self._lock:  # changes mutate the table in place
            groups = list(self.groups.values())
        return sorted(groups, key=_name)

    def close(self) -> None:
        self._table.close()

    def _put(self, group: SubscriptionGroup, *, created: bool) -> None:
        # Callers hold the lock and have changed nothing yet: a refusal leaves all as it was.
        if created and len(self.groups) >= self.max_groups:
            raise too_many_groups(group.group, self.max_groups)
        self._table.change([group])


# ------------------------------------------------------------------ the wire (config sync, admin)
def settings_proto(s: GroupSettings) -> Any:
    return broker_pb2.ConsumerGroupSettings(
        max_delivery_attempts=s.max_delivery_attempts,
        retry_policy=s.retry_policy.to_proto(),
        fifo=s.fifo,
        consume_enabled=s.consume_enabled,
    )


def settings_of(p: Any) -> GroupSettings:
    """A ConsumerGroupSettings as the master sent it; raises ValueError when it is not valid."""
    return GroupSettings(
        max_delivery_attempts=p.max_delivery_attempts,
        retry_policy=RetryPolicy.from_proto(p.retry_policy),
        fifo=p.fifo,
        consume_enabled=p.consume_enabled,
    )


def group_proto(g: SubscriptionGroup) -> Any:
    return broker_pb2.SubscriptionGroup(
        group=g.group,
        mode=g.mode,
        topics=g.topics,
        created_ms=g.created_ms,
        model=g.model,
        settings=settings_proto(g.settings),
    )


def group_of(p: Any) -> SubscriptionGroup:
    """A SubscriptionGroup from the wire. A master older than receive/ack sends no settings:
    the defaults. Settings this version cannot hold (a newer master's wider limits) are logged
    and replaced by the defaults rather than failing the whole table."""
    settings = GroupSettings()
    if p.HasField("settings"):
        try:
            settings = settings_of(p.settings)
        except ValueError as e:
            log.warning(
                "consumer group %s: settings not taken (%s); using the defaults", p.group, e
            )
    return SubscriptionGroup(p.group, p.mode, tuple(p.topics), p.created_ms, p.model, settings)
