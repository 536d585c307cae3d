"""Every ConsumeQueue of a store, kept so that what they cost follows the work done, not how many
queues exist (docs/storage.md, "Many queues"):

- At open a queue is found by its directory's file names alone: nothing is mapped or read. It is
  mapped on first use, and the first time after a restart also recovered there: its last valid
  entry found, entries past any cut made since the store opened removed (``pending_trim``), its
  minimum corrected to the CommitLog's.
- At most ``max_open_files`` files are mapped at once; beyond that the least recently used queues
  are unmapped. Each mapped file holds two descriptors (Python's mmap keeps a duplicate) and a
  mapping, so 400,000 queues mapped at once would pass both the descriptor limit and
  vm.max_map_count (65530 by default).
- Flushes visit only the queues written since they last flushed them (the dirty set); a queue
  unmapped before its bytes were synced keeps its files' paths to sync by name.

Every ConsumeQueue method takes ``lock`` (re-entrant): a queue is never unmapped under a reader.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import threading
from collections.abc import Callable

from tidemq.storage.consume_queue import ENTRY_SIZE, ConsumeQueue
from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


def _names_range(directory: str, file_size: int) -> tuple[int, int]:
    """(first byte, end byte) of a queue's files from their names; the checks ``load`` of its
    files makes, without opening one. Raises CorruptStoreError for a file missing in between."""
    bases = sorted(int(n) for n in os.listdir(directory) if n.isdigit() and len(n) == 20)
    prev = None
    for base in bases:
        if base % file_size:
            raise CorruptStoreError(
                f"{directory}/{base:020d}: offset is not a multiple of the file size {file_size}"
            )
        if prev is not None and base != prev + file_size:
            raise CorruptStoreError(f"{directory}: a file is missing after {prev:020d}")
        prev = base
    if not bases:
        return 0, 0
    return bases[0], bases[-1] + file_size


class ConsumeQueueStore:
    """Every ConsumeQueue of the store, created on first use (see the module's docstring)."""

    def __init__(
        self,
        root_dir: str,
        entries_per_file: int,
        max_open_files: int = 4096,
        log_min: Callable[[], int] = lambda: 0,
    ) -> None:
        self.root_dir = root_dir
        self.entries_per_file = entries_per_file
        self.max_open_files = max_open_files
        self._log_min = log_min
        self.queues: dict[QueueKey, ConsumeQueue] = {}
        # Queues whose files could not be loaded (one missing in the middle): removed at load,
        # recovery rebuilds them from the CommitLog.
        self.damaged: list[QueueKey] = []
        self.lock = threading.RLock()
        self._mapped: collections.OrderedDict[ConsumeQueue, None] = collections.OrderedDict()
        self.open_files = 0
        self._dirty: set[ConsumeQueue] = set()
        # The lowest cut (recovery's, a truncation's) since the store opened: a queue not yet
        # recovered applies it when first mapped.
        self.pending_trim: int | None = None
        self.version = 0  # moves when the set of queues changes (the manifest's cue)
        # For tests and tools: queues mapped and unmapped, and queues visited by flushes.
        self.maps = 0
        self.unmaps = 0
        self.flush_visits = 0

    # ----------------------------------------------------------------- load
    def load(self) -> None:
        top = os.path.join(self.root_dir, "consumequeue")
        if not os.path.isdir(top):
            return
        file_size = self.entries_per_file * ENTRY_SIZE
        with os.scandir(top) as topics:
            topic_dirs = [(e.name, e.path) for e in topics if e.is_dir()]
        for topic, tdir in topic_dirs:
            with os.scandir(tdir) as qids:
                qdirs = [(e.name, e.path) for e in qids if e.name.isdigit() and e.is_dir()]
            for qid, qdir in qdirs:
                key = (topic, int(qid))
                try:
                    names = _names_range(qdir, file_size)
                except CorruptStoreError as e:
                    log.warning("%s; the queue will be rebuilt from the CommitLog", e)
                    shutil.rmtree(qdir)
                    self.damaged.append(key)
                    continue
                cq = ConsumeQueue(self.root_dir, topic, int(qid), self.entries_per_file, self)
                cq.names_range = names
                self.queues[key] = cq
        self.version += 1

    # ----------------------------------------------------------------- lookup
    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self.lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self.root_dir, topic, queue_id, self.entries_per_file, self)
                    cq.known = True  # new: no entries, its first write makes its directory
                    self.queues[topic, queue_id] = cq
                    self.version += 1
        return cq

    def next_queue_offset(self, key: QueueKey) -> int:
        """The queue offset the next message of ``key`` gets, as its entries say (0 for a queue
        that does not exist): the topic queue table's answer for a queue not in it yet."""
        cq = self.queues.get(key)
        return 0 if cq is None else cq.max_offset

    def all(self) -> list[ConsumeQueue]:
        with self.lock:
            return list(self.queues.values())

    def items(self) -> list[tuple[QueueKey, ConsumeQueue]]:
        with self.lock:
            return list(self.queues.items())

    def mapped_queues(self) -> list[ConsumeQueue]:
        with self.lock:
            return list(self._mapped)

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    # ----------------------------------------------------------------- mapping (ConsumeQueue's)
    def map_queue(self, cq: ConsumeQueue) -> MappedFileQueue:
        """Map ``cq``'s files (recovering it, the first time), unmapping others past the bound."""
        with self.lock:
            mfq = MappedFileQueue(cq.directory, cq.file_size)
            if not (cq.known and cq.names_range == (0, 0)):  # else nothing on disk to load
                mfq.load()
            cq.attach(mfq)
            self._mapped[cq] = None
            cq.counted_files = len(mfq.files)
            self.open_files += cq.counted_files
            self.maps += 1
            try:
                if cq.known:
                    # Where this process left it; what was not synced is in ``unsynced``.
                    mfq.set_positions(cq.closed_end_byte)
                else:
                    cq.recover()
                    if self.pending_trim is not None:
                        cq.truncate_phy(self.pending_trim)
                # Retention may have moved the CommitLog's minimum while it was unmapped.
                cq.correct_min_offset(self._log_min())
            except BaseException:
                self._unmap(cq)
                raise
            self._evict(cq)
            return mfq

    def touch(self, cq: ConsumeQueue) -> None:
        self._mapped.move_to_end(cq)

    def wrote(self, cq: ConsumeQueue, mfq: MappedFileQueue) -> None:
        """``cq`` took entries (the caller holds the lock): it is dirty, and may have a new file."""
        self._dirty.add(cq)
        n = len(mfq.files)
        if n != cq.counted_files:
            self.open_files += n - cq.counted_files
            cq.counted_files = n
            self._evict(cq)

    def _evict(self, keep: ConsumeQueue) -> None:
        mapped = self._mapped
        while self.open_files > self.max_open_files and len(mapped) > 1:
            oldest = next(iter(mapped))
            if oldest is keep:
                mapped.move_to_end(keep)
                continue
            self._unmap(oldest)

    def _unmap(self, cq: ConsumeQueue) -> None:
        mfq = cq._mfq
        if mfq is None:
            return
        for f in mfq.files:
            if f.flushed < f.committed:
                cq.unsynced.append(f.path)
        if cq.unsynced:
            self._dirty.add(cq)
        files = mfq.files
        cq.closed_end_byte = mfq.max_offset
        cq.names_range = (files[0].base_offset, files[-1].end_offset) if files else (0, 0)
        mfq.close()
        cq.attach(None)
        self._mapped.pop(cq, None)
        self.open_files -= cq.counted_files
        cq.counted_files = 0
        self.unmaps += 1

    # ----------------------------------------------------------------- flush
    def flush(self, least_pages: int = 0) -> None:
        """Sync the queues written since they were last synced. ``least_pages`` > 0 leaves a
        file with fewer dirty pages (unless full) for a later flush."""
        with self.lock:
            dirty, self._dirty = self._dirty, set()
        left: list[ConsumeQueue] = []
        try:
            for cq in dirty:
                self.flush_visits += 1
                if not self._sync(cq, least_pages):
                    left.append(cq)
        except BaseException:
            with self.lock:  # a failed flush leaves every queue it took dirty
                self._dirty |= dirty
            raise
        if left:
            with self.lock:
                self._dirty.update(left)

    def _sync(self, cq: ConsumeQueue, least_pages: int) -> bool:
        """fdatasync what ``cq`` holds unsynced, the descriptors taken under the lock and synced
        outside it (a reader or dispatch waits for no disk); False when something was left."""
        handles: list[tuple[MappedFile, int, int]] = []
        left = False
        with self.lock:
            paths, cq.unsynced = cq.unsynced, []
            mfq = cq._mfq
            for f in mfq.files if mfq is not None else ():
                if least_pages and not f.is_full and 0 < f.dirty_pages() < least_pages:
                    left = True
                    continue
                taken = f.dup_for_sync()
                if taken is not None:
                    handles.append((f, *taken))
        try:
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:  # deleted since (retention, truncation): nothing to keep
                    continue
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            for _, fd, _ in handles:
                os.fdatasync(fd)
        except BaseException:
            with self.lock:
                cq.unsynced.extend(paths)
            raise
        finally:
            for _, fd, _ in handles:
                os.close(fd)
        with self.lock:
            for f, _, done in handles:
                if f.flushed < done <= f.committed:  # a truncation since may have cut below it
                    f.flushed = done
        return not left

    # ----------------------------------------------------------------- truncation / retention
    def rewind(self, offset: int) -> None:
        """Every queue forgets its entries at or past CommitLog ``offset``: mapped ones and ones
        this process wrote now, the ones not recovered yet when first mapped."""
        with self.lock:
            for cq in list(self.queues.values()):
                if cq.mapped or (cq.known and cq.max_physic_offset > offset):
                    cq.truncate_phy(offset)
            if self.pending_trim is None or offset < self.pending_trim:
                self.pending_trim = offset

    def correct_min_offsets(self, commitlog_min: int) -> None:
        """Mapped queues now; the others when they are next mapped."""
        for cq in self.mapped_queues():
            cq.correct_min_offset(commitlog_min)

    def delete_expired(self, commitlog_min: int) -> None:
        """Delete queue files wholly below the CommitLog's new minimum. A queue with one file
        keeps it (the last file is never deleted), so only queues with more are looked at."""
        file_size = self.entries_per_file * ENTRY_SIZE
        for cq in self.all():
            first, end = cq.names_range
            if cq.mapped or end - first > file_size:
                cq.delete_expired(commitlog_min)

    def drop(self, key: QueueKey) -> None:
        """Delete a queue that lost files; recovery rebuilds it from the CommitLog."""
        with self.lock:
            cq = self.queues.pop(key, None)
            if cq is None:
                return
            self._unmap(cq)
            self._dirty.discard(cq)
            shutil.rmtree(cq.directory, ignore_errors=True)
            self.version += 1

    def destroy_all(self) -> None:
        """Delete every queue's files (a store without a CommitLog)."""
        with self.lock:
            for key in list(self.queues):
                self.drop(key)

    def reset(self) -> None:
        """Forget every queue (their files were moved away): a store starting again empty."""
        with self.lock:
            self.close()
            self.queues = {}
            self.damaged = []
            self._dirty = set()
            self.pending_trim = None
            self.version += 1

    def close(self) -> None:
        with self.lock:
            for cq in list(self._mapped):
                self._unmap(cq)
