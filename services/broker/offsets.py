"""Committed consumer offsets, persisted as ``{store}/config/consumerOffset.json``.

Commits land in memory at once and reach disk atomically every ``flush_interval`` (5 s, the
broker's scheduler calls ``persist``) and at shutdown, as RocketMQ's ConsumerOffsetManager.

Every offset carries the wall-clock time its commit was taken. A slave merges its master's table
by that time (``merge``): an offset committed on the slave while the master was away is newer
than the master's and survives the master's return (RocketMQ #1094, where the master's stale
table overwrote it).

File format (RocketMQ's ``offsetTable`` plus our commit times; files without
``commitTimestamps`` load with time 0, so any synced offset replaces them)::

    {"offsetTable": {"topic@group": {"0": 42}},
     "commitTimestamps": {"topic@group": {"0": 1700000000000}}}
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tidemq.storage.atomic_file import read_json_with_fallback, write_json_atomic


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    group: str
    topic: str
    queue_id: int
    offset: int
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class MergeResult:
    taken: int  # entries the master's table set or moved
    kept: int  # local entries newer than the master's, kept


class OffsetManager:
    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "config", "consumerOffset.json")
        self._lock = threading.Lock()
        # "topic@group" -> queue id -> next offset to consume
        self.table: dict[str, dict[int, int]] = {}
        # "topic@group" -> queue id -> commit time (ms since the epoch)
        self.stamps: dict[str, dict[int, int]] = {}
        self._dirty = False
        raw = read_json_with_fallback(self.path)
        if raw:
            self.table = {
                key: {int(q): int(o) for q, o in queues.items()}
                for key, queues in raw.get("offsetTable", {}).items()
            }
            self.stamps = {
                key: {int(q): int(t) for q, t in queues.items()}
                for key, queues in raw.get("commitTimestamps", {}).items()
            }

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, now_ms: int, reset: bool = False
    ) -> int:
        """Record a commit; returns the queue's offset after it. Only a reset moves it back."""
        key = self.key(topic, group)
        with self._lock:
            queues = self.table.setdefault(key, {})
            current = queues.get(queue_id)
            if current is not None and offset < current and not reset:
                return current
            queues[queue_id] = offset
            self.stamps.setdefault(key, {})[queue_id] = now_ms
            self._dirty = True
            return offset

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(self.key(topic, group), {}).get(queue_id)

    def entries(self) -> list[CommittedOffset]:
        with self._lock:
            return [
                CommittedOffset(group, topic, q, o, self.stamps.get(key, {}).get(q, 0))
                for key, queues in self.table.items()
                for topic, _, group in [key.partition("@")]
                for q, o in queues.items()
            ]

    def merge(self, remote: Iterable[CommittedOffset]) -> MergeResult:
        """Take the master's offsets, except where the local commit is newer (the newer commit
        wins; equal times take the master's, which then agrees everywhere)."""
        taken = kept = 0
        with self._lock:
            for r in remote:
                key = self.key(r.topic, r.group)
                stamps = self.stamps.setdefault(key, {})
                queues = self.table.setdefault(key, {})
                local_ts = stamps.get(r.queue_id)
                if local_ts is not None and local_ts > r.commit_timestamp_ms:
                    kept += 1
                    continue
                if queues.get(r.queue_id) != r.offset or local_ts != r.commit_timestamp_ms:
                    queues[r.queue_id] = r.offset
                    stamps[r.queue_id] = r.commit_timestamp_ms
                    self._dirty = True
                    taken += 1
        return MergeResult(taken, kept)

    def persist(self) -> bool:
        """Write the table if it changed; returns whether it wrote."""
        with self._lock:
            if not self._dirty:
                return False
            snapshot = {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}
            stamps = {k: {str(q): t for q, t in v.items()} for k, v in self.stamps.items()}
            self._dirty = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(self.path, {"offsetTable": snapshot, "commitTimestamps": stamps})
        return True
