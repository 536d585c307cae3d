"""A broker state table (topics, subscription groups) whose changes cost what changed: a dict of
items by name with its data version and change log, persisted as an atomic JSON snapshot
(``topics.json``, ``subscriptionGroup.json``: the names and shapes operators and
``repair-state`` know) plus an append-only journal beside it (``<snapshot>.journal``,
``state_journal``).

Every change appends one record, fsync'd before the change is answered::

    {"seq": N, "v": <data version after it>, "put": [<item>, ...], "del": [<name>, ...]}

and a restart replays the journal over the snapshot. When the journal holds more records than
``max(COMPACT_MIN_ENTRIES, items / 4)`` the snapshot is rewritten (atomically) and the journal
emptied, so a change costs O(1) amortized (a snapshot of n items every n/4 changes) and a
restart replays at most that many records. The snapshot's ``journal_seq`` names the last record
it holds: a crash between a compaction's snapshot and its truncation replays nothing twice.

Not thread-safe: the manager that owns the table holds its lock around every call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, replace
from typing import Any, Generic, TypeVar

from tidemq.services.broker import state_journal
from tidemq.services.broker.change_log import ChangeLog
from tidemq.services.broker.data_version import DataVersion
from tidemq.storage.atomic_file import write_json_atomic
from tidemq.storage.errors import StoreError
from tidemq.storage.state_file import ShapeError, StateFileError, from_json

T = TypeVar("T")

COMPACT_MIN_ENTRIES = 1000
JOURNAL_SUFFIX = ".journal"


def journal_path(snapshot_path: str) -> str:
    return snapshot_path + JOURNAL_SUFFIX


def replay(
    path: str,
    fix: str,
    items: dict[str, T],
    version: DataVersion,
    snapshot_seq: int,
    item_of: Callable[[Any], T],
    key: Callable[[T], str],
) -> tuple[state_journal.Replay, DataVersion, int]:
    """Apply the journal's records after ``snapshot_seq`` to ``items`` (in place); returns the
    replay, the data version and the seq they lead to. StateFileError on a damaged record."""
    jpath = journal_path(path)
    read = state_journal.read(jpath, fix)
    seq = snapshot_seq
    for number, record in enumerate(read.records, 1):
        if record["seq"] <= snapshot_seq:
            continue  # the snapshot holds it (a crash before the compaction's truncation)
        try:
            puts = [item_of(p) for p in record.get("put", [])]
            dels = record.get("del", [])
            if not isinstance(dels, list) or not all(isinstance(d, str) for d in dels):
                raise ShapeError("'del'", "a list of names", dels)
            version = from_json(type(version), record.get("v"), "'v'")
        except (ValueError, StoreError) as e:
            raise StateFileError(jpath, f"line {number}: {e}", fix) from None
        for item in puts:
            items[key(item)] = item
        for name in dels:
            items.pop(name, None)
        seq = record["seq"]
    return read, version, seq


class JournaledTable(Generic[T]):
    def __init__(
        self,
        path: str,
        fix: str,
        list_key: str,
        items: dict[str, T],
        version: DataVersion,
        seq: int,
        read: state_journal.Replay,
        key: Callable[[T], str],
        to_json: Callable[[T], Any],
        log_capacity: int,
    ) -> None:
        self.path = path
        self.list_key = list_key  # the snapshot's key of the item list: "topics", "groups"
        self.items = items
        self.version = version
        self.seq = seq
        self.key = key
        self.to_json = to_json
        self.log = ChangeLog(version, log_capacity)
        self.journal = state_journal.Journal(journal_path(path), read)
        self.snapshot_bytes = 0  # written by compactions since start; what scale tests measure

    @property
    def bytes_written(self) -> int:
        return self.journal.bytes_written + self.snapshot_bytes

    def change(self, puts: Iterable[T] = (), dels: Iterable[str] = ()) -> None:
        """Apply a change made here: bump the version, log it, journal it (durable on return)."""
        puts, dels = list(puts), list(dels)
        for item in puts:
            self.items[self.key(item)] = item
        for name in dels:
            self.items.pop(name, None)
        self.version.bump()
        for name in [self.key(i) for i in puts] + dels:
            self.log.record(self.version.counter, name, self.version.timestamp_ms)
        self._journal(puts, dels)

    def had(self, version: DataVersion) -> bool:
        return version.state_version == self.version.state_version and self.log.had(version)

    def changes_since(self, version: DataVersion) -> tuple[list[T], list[str]] | None:
        """(upserted as they are now, removed) after ``version``; None when not all known."""
        touched = self.log.since(version, self.version)
        if touched is None:
            return None
        upserted = [self.items[k] for k in sorted(touched) if k in self.items]
        removed = sorted(k for k in touched if k not in self.items)
        return upserted, removed

    def apply_changes(
        self, upserted: list[T], removed: list[str], since: DataVersion, version: DataVersion
    ) -> bool | None:
        """Config sync on a slave: the master's changes after ``since`` leading to ``version``.
        None (nothing done) when this table is not at ``since`` any more or ``version`` is not
        after it: the caller asks again and gets what fits, or everything. The version becomes
        the master's exactly; every changed name is logged at it, so this table's own
        ``changes_since`` stays right (a version between ``since`` and ``version``, which this
        table never had, gets a superset)."""
        if since != self.version or version.state_version != since.state_version:
            return None
        if version.counter < since.counter:
            return None
        self.version.counter = version.counter
        self.version.timestamp_ms = version.timestamp_ms
        if not upserted and not removed:
            if version != since:
                self.log.stamp(version.counter, version.timestamp_ms)
                self._journal([], [])
            return False
        for item in upserted:
            self.items[self.key(item)] = item
        for name in removed:
            self.items.pop(name, None)
        for name in [self.key(i) for i in upserted] + removed:
            self.log.record(version.counter, name, version.timestamp_ms)
        self._journal(upserted, removed)
        return True

    def replace_all(self, items: dict[str, T], version: DataVersion) -> None:
        """Everything at once (a full config sync): a snapshot, the journal emptied."""
        self.items.clear()
        self.items.update(items)
        self.version = replace(version)
        self.log.reset(self.version)
        self.compact()

    def _journal(self, puts: list[T], dels: list[str]) -> None:
        self.seq += 1
        self.journal.append(
            {
                "seq": self.seq,
                "v": asdict(self.version),
                "put": [self.to_json(i) for i in puts],
                "del": dels,
            }
        )
        if self.journal.entries > max(COMPACT_MIN_ENTRIES, len(self.items) // 4):
            self.compact()

    def compact(self) -> None:
        """Rewrite the snapshot to hold everything, then empty the journal."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        doc = {
            self.list_key: [self.to_json(self.items[k]) for k in sorted(self.items)],
            "data_version": asdict(self.version),
            "journal_seq": self.seq,
        }
        write_json_atomic(self.path, doc, compact=True)
        self.snapshot_bytes += _size(self.path)
        self.journal.truncate()

    def close(self) -> None:
        self.journal.close()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0
