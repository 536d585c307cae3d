"""Committed consumer offsets, persisted as ``{store}/config/consumerOffset.json``.

Commits land in memory at once and reach disk atomically every ``flush_interval`` (5 s, the
broker's scheduler calls ``persist``) and at shutdown, as RocketMQ's ConsumerOffsetManager. A
period without a change writes nothing; one with changes rewrites the table once, whatever the
number of commits (docs/operations.md, "Limits", has the cost at 40,000 queue offsets).

Config sync sends what changed: every change of a queue's offset takes the next number of a
per-process count (``seq``; ``instance`` tells one process's count from another's), and
``changes_since`` answers the offsets changed after a count, oldest change first.

Brokers of a group exchange their tables both ways (config sync, ``merge``) and must agree
without trusting each other's clocks (RocketMQ #1094). Each offset carries a version,
``(generation, offset)``: a consumer's commit only moves the offset forward within its
generation; an explicit reset (the admin's reset, ``reset=True``) starts the next generation,
where the offset may be anything. A merge keeps the higher version, so a committed offset never
moves backwards except by a reset, whichever broker took the commit and in whatever order the
tables meet (the merge is commutative, associative and idempotent).

File format (RocketMQ's ``offsetTable``, plus the generation of every queue that was reset;
a queue without one is at generation 0)::

    {"offsetTable": {"topic@group": {"0": 42}},
     "resetGenerations": {"topic@group": {"0": 1}}}
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemq.storage import state_file
from tidemq.storage.atomic_file import write_json_atomic
from tidemq.storage.state_file import ShapeError

log = logging.getLogger(__name__)

FILE_NAME = "consumerOffset.json"


@dataclass(frozen=True, order=True, slots=True)
class OffsetVersion:
    generation: int  # explicit resets of this queue's offset so far
    offset: int


def supersedes(candidate: OffsetVersion, current: OffsetVersion | None) -> bool:
    """Whether ``candidate`` replaces ``current``: a later generation, or the same generation
    further on. The one merge rule of committed offsets; no clock takes part."""
    return current is None or candidate > current


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    group: str
    topic: str
    queue_id: int
    offset: int
    generation: int = 0

    @property
    def version(self) -> OffsetVersion:
        return OffsetVersion(self.generation, self.offset)


@dataclass(frozen=True, slots=True)
class MergeResult:
    taken: int  # entries the other broker's table set or moved forward here
    kept: int  # local entries ahead of the other broker's (it takes them in its turn)
    # The change count before and after the merge (nothing else changed in between).
    seq_before: int = 0
    seq_after: int = 0


@dataclass(frozen=True)
class OffsetFile:
    """The shape of consumerOffset.json."""

    offset_table: dict[str, dict[int, int]] = field(metadata={"key": "offsetTable"})
    generations: dict[str, dict[int, int]] = field(
        default_factory=dict, metadata={"key": "resetGenerations"}
    )

    def __post_init__(self) -> None:
        for name, table in (
            ("offsetTable", self.offset_table),
            ("resetGenerations", self.generations),
        ):
            for key, queues in table.items():
                if "@" not in key:
                    raise ShapeError(f"{name}[{key!r}]", "a 'topic@group' key", key)
                for q, n in queues.items():
                    if n < 0 or q < 0:
                        raise ShapeError(f"{name}[{key!r}][{str(q)!r}]", "a number >= 0", n)


def fix_hint(store_dir: str) -> str:
    return (
        f"`tidemq broker repair-state --store {store_dir} --from-peer HOST:PORT` copies the "
        f"offsets of a running broker of the group, or `--reset offsets` starts with none "
        f"(consumers then start where their start_from says); either keeps the bad file as "
        f"{FILE_NAME}.corrupt-<time>"
    )


def load_offsets(store_dir: str) -> OffsetFile | None:
    """The stored table (None when the broker never wrote one); StateFileError when damaged."""
    path = os.path.join(store_dir, "config", FILE_NAME)
    return state_file.load(path, OffsetFile, fix_hint(store_dir))


class OffsetManager:
    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self._lock = threading.Lock()
        # "topic@group" -> queue id -> next offset to consume
        self.table: dict[str, dict[int, int]] = {}
        # "topic@group" -> queue id -> reset generation (absent: 0)
        self.generations: dict[str, dict[int, int]] = {}
        self._dirty = False
        # Changes are counted from 0 in each process: a reader's count from another process
        # (before a restart) means nothing here, and the instance tells.
        self.instance = random.getrandbits(62) + 1
        self.seq = 0
        # (key, queue id) -> seq of its last change, in the order of those changes.
        self._changed_at: dict[tuple[str, int], int] = {}
        stored = load_offsets(store_dir)
        if stored is not None:
            self.table = {k: dict(v) for k, v in stored.offset_table.items()}
            self.generations = {k: dict(v) for k, v in stored.generations.items() if v}

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def _version(self, key: str, queue_id: int) -> OffsetVersion | None:
        offset = self.table.get(key, {}).get(queue_id)
        if offset is None:
            return None
        return OffsetVersion(self.generations.get(key, {}).get(queue_id, 0), offset)

    def _set(self, key: str, queue_id: int, version: OffsetVersion) -> None:
        self.table.setdefault(key, {})[queue_id] = version.offset
        if version.generation:
            self.generations.setdefault(key, {})[queue_id] = version.generation
        self._dirty = True
        self.seq += 1
        # Re-inserted, so the dict stays in the order of the last changes.
        self._changed_at.pop((key, queue_id), None)
        self._changed_at[(key, queue_id)] = self.seq

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, *, reset: bool = False
    ) -> int:
        """Record a commit; returns the queue's offset after it. Only a reset moves it back."""
        key = self.key(topic, group)
        with self._lock:
            current = self._version(key, queue_id)
            generation = current.generation if current is not None else 0
            if reset:
                self._set(key, queue_id, OffsetVersion(generation + 1, offset))
                return offset
            new = OffsetVersion(generation, offset)
            if not supersedes(new, current):
                assert current is not None
                return current.offset
            self._set(key, queue_id, new)
            return offset

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(self.key(topic, group), {}).get(queue_id)

    def entries(self) -> list[CommittedOffset]:
        with self._lock:
            return self._entries()

    def _entries(self) -> list[CommittedOffset]:
        return [
            CommittedOffset(group, topic, q, o, self.generations.get(key, {}).get(q, 0))
            for key, queues in self.table.items()
            for topic, _, group in [key.partition("@")]
            for q, o in queues.items()
        ]

    def changes_since(self, instance: int, seq: int) -> tuple[list[CommittedOffset], int] | None:
        """The offsets changed after change ``seq`` of ``instance`` and the count they lead to;
        None when that count is not this process's (a restart, another broker)."""
        with self._lock:
            if instance != self.instance or not 0 <= seq <= self.seq:
                return None
            changed = []
            for (key, q), at in reversed(self._changed_at.items()):
                if at <= seq:
                    break
                topic, _, group = key.partition("@")
                gen = self.generations.get(key, {}).get(q, 0)
                changed.append(CommittedOffset(group, topic, q, self.table[key][q], gen))
            changed.reverse()
            return changed, self.seq

    def entries_at(self) -> tuple[list[CommittedOffset], int]:
        """Every offset, and the change count they are at (``changes_since`` goes on from it)."""
        with self._lock:
            return self._entries(), self.seq

    def merge(self, other: Iterable[CommittedOffset]) -> MergeResult:
        """Take another broker's offsets where they supersede ours (``supersedes``)."""
        taken = kept = 0
        with self._lock:
            before = self.seq
            for r in other:
                key = self.key(r.topic, r.group)
                local = self._version(key, r.queue_id)
                if supersedes(r.version, local):
                    self._set(key, r.queue_id, r.version)
                    taken += 1
                elif local != r.version:
                    kept += 1
            return MergeResult(taken, kept, before, self.seq)

    def drop_topics(self, topics: Iterable[str]) -> int:
        """Forget every group's offsets of ``topics`` (deleted topics: ``offset_cleanup``);
        returns how many queue offsets went."""
        gone = set(topics)
        dropped = 0
        with self._lock:
            for key in [k for k in self.table if k.partition("@")[0] in gone]:
                for q in self.table.pop(key):
                    self._changed_at.pop((key, q), None)
                    dropped += 1
                self.generations.pop(key, None)
                self._dirty = True
        return dropped

    def persist(self) -> bool:
        """Write the table if it changed; returns whether it wrote."""
        with self._lock:
            if not self._dirty:
                return False
            snapshot = {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}
            generations = {
                k: {str(q): g for q, g in v.items()} for k, v in self.generations.items() if v
            }
            self._dirty = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(
            self.path, {"offsetTable": snapshot, "resetGenerations": generations}, compact=True
        )
        return True
