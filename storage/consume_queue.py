"""ConsumeQueue: per (topic, queue id), the index from queue offset to CommitLog position.

Files live in ``{root}/consumequeue/{topic}/{queue_id}/`` and are named by their first byte's
offset (entry number x 20). Each entry is 20 bytes, big-endian::

    +----------------------+--------------+------------------------+
    | CommitLog offset (8) | size (4)     | tag code (8)           |  = 20 bytes
    +----------------------+--------------+------------------------+

Entry n sits at byte 20 * n, so the queue offset a consumer sees is the byte position / 20. The tag
code is the Java hash code of the message's TAGS (0 without tags), or for a ``%SYS%TIMER``
record its delivery time (``RecordInfo.entry_tag_code``, ``record.properties``). A "blank" entry
(offset 0, size 0x7FFFFFFF, tag 0) pads a queue whose first entry is not entry 0: a replica that
starts from its master's oldest retained message.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from tidemq.storage.mapped_file_queue import MappedFileQueue

if TYPE_CHECKING:
    from tidemq.storage.queue_store import ConsumeQueueStore

ENTRY: Final = struct.Struct(">qiq")
ENTRY_SIZE: Final = 20
BLANK_ENTRY_SIZE_FIELD: Final = 0x7FFFFFFF
BLANK_ENTRY: Final = ENTRY.pack(0, BLANK_ENTRY_SIZE_FIELD, 0)

# put() outcomes
WRITTEN: Final = 0
DUPLICATE: Final = 1
GAP: Final = 2


def queue_dir(root_dir: str, topic: str, queue_id: int) -> str:
    return os.path.join(root_dir, "consumequeue", topic, str(queue_id))


def is_blank(phy: int, size: int) -> bool:
    return phy == 0 and size == BLANK_ENTRY_SIZE_FIELD


# A standalone queue (tools, tests) has nobody to share a lock with.
_NO_LOCK: Final = contextlib.nullcontext()


class ConsumeQueue:
    """One queue's entries. Standalone (``keeper`` None: tools) it is mapped by ``load`` and
    stays mapped. Kept by a ``ConsumeQueueStore`` its files are mapped on first use and may be
    unmapped again when the store holds too many open (``queue_store``): every method then takes
    the store's lock, maps the files if they are not, and tells the store the queue was used."""

    __slots__ = (
        "_keeper",
        "_lock",
        "_mfq",
        "closed_end_byte",
        "counted_files",
        "directory",
        "file_size",
        "known",
        "max_physic_offset",
        "min_logic_byte",
        "names_range",
        "queue_id",
        "topic",
        "unsynced",
    )

    def __init__(
        self,
        root_dir: str,
        topic: str,
        queue_id: int,
        entries_per_file: int,
        keeper: ConsumeQueueStore | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = queue_dir(root_dir, topic, queue_id)
        self.file_size = entries_per_file * ENTRY_SIZE
        self.max_physic_offset = -1  # end (offset + size) of the newest entry, -1 when empty
        self.min_logic_byte = 0  # byte position of the oldest live entry
        self._keeper = keeper
        self._lock: threading.RLock | contextlib.nullcontext[None] = (
            _NO_LOCK if keeper is None else keeper.lock
        )
        # Mapped files; a kept queue has None while unmapped.
        self._mfq: MappedFileQueue | None = (
            MappedFileQueue(self.directory, self.file_size) if keeper is None else None
        )
        # Whether this process knows where the queue's entries end: False for a queue found on
        # disk and not recovered yet (its first mapping recovers it), True once recovered or
        # made here. While unmapped and known, ``closed_end_byte`` is where they end.
        self.known = keeper is None
        self.closed_end_byte = 0
        # (first byte, end byte) of the files found at load, from their names alone: what
        # recovery compares with the manifest without mapping anything.
        self.names_range = (0, 0)
        self.counted_files = 0  # files the store counts as mapped for this queue
        # Files unmapped with bytes not yet fdatasync'd: the next flush syncs them by path.
        self.unsynced: list[str] = []

    @property
    def mfq(self) -> MappedFileQueue:
        """The mapped files, mapped now if they are not (a kept queue's caller holds the lock)."""
        mfq = self._mfq
        if self._keeper is None:
            assert mfq is not None
            return mfq
        if mfq is None:
            return self._keeper.map_queue(self)
        self._keeper.touch(self)
        return mfq

    @property
    def mapped(self) -> bool:
        return self._mfq is not None

    def attach(self, mfq: MappedFileQueue | None) -> None:
        """Set (or with None drop) the mapped files: for the store that keeps the queue."""
        self._mfq = mfq

    # ----------------------------------------------------------------- offsets
    @property
    def min_offset(self) -> int:
        with self._lock:
            first = self.mfq.min_offset  # first: mapping a queue corrects its minimum
            return max(self.min_logic_byte, first) // ENTRY_SIZE

    @property
    def max_offset(self) -> int:
        """Queue offset the next entry gets (the number of entries, including expired ones)."""
        if self._mfq is None and self.known:
            return self.closed_end_byte // ENTRY_SIZE  # exact: only writes (which map) move it
        with self._lock:
            return self.mfq.max_offset // ENTRY_SIZE

    # ----------------------------------------------------------------- load / recover
    def load(self) -> None:
        with self._lock:
            self.mfq.load()

    def recover(self) -> None:
        """Find the last valid entry (spec §3.2), cut everything after it (zeroed)."""
        with self._lock:
            self._recover()
            self.known = True

    def _recover(self) -> None:
        files = self.mfq.files
        if not files:
            return
        end = files[max(0, len(files) - 3)].base_offset
        max_phy = -1
        for f in files[max(0, len(files) - 3) :]:
            pos = 0
            for phy, size, _tag in ENTRY.iter_unpack(f.mm):
                if phy < 0 or size <= 0:
                    break
                if not is_blank(phy, size):
                    max_phy = phy + size
                pos += ENTRY_SIZE
            end = f.base_offset + pos
            if pos < f.size:
                break
        self.mfq.truncate(end)
        self.mfq.set_positions(end)
        self.max_physic_offset = max_phy if max_phy >= 0 else self._scan_max_phy()
        self.min_logic_byte = max(self.min_logic_byte, self.mfq.min_offset)

    def _scan_max_phy(self) -> int:
        q = self.max_offset - 1
        while q >= self.min_offset:
            e = self.get(q)
            if e is not None and not is_blank(e[0], e[1]):
                return e[0] + e[1]
            q -= 1
        return -1

    # ----------------------------------------------------------------- write
    def _wrote(self, mfq: MappedFileQueue) -> None:
        keeper = self._keeper
        if keeper is not None:
            keeper.wrote(self, mfq)

    def put(
        self, phy: int, size: int, tag_code: int, queue_offset: int, allow_prefill: bool
    ) -> int:
        """Append the entry for a dispatched record. Idempotent: a replay is a DUPLICATE.

        GAP means entries are missing before this one (lost files): nothing is written and the
        caller decides whether to rebuild. With ``allow_prefill`` an empty queue starting past
        entry 0 is padded with blank entries instead.
        """
        with self._lock:
            mfq = self.mfq
            if phy + size <= self.max_physic_offset:
                return DUPLICATE
            expected = queue_offset * ENTRY_SIZE
            if not mfq.files and expected:
                if not allow_prefill:
                    return GAP
                self._prefill(mfq, expected)
            cur = mfq.max_offset
            if expected < cur:
                return DUPLICATE
            if expected > cur:
                return GAP
            f = mfq.file_for_append(expected)
            ENTRY.pack_into(f.mm, f.wrote, phy, size, tag_code)
            f.wrote += ENTRY_SIZE
            self.max_physic_offset = phy + size
            self._wrote(mfq)
            return WRITTEN

    def put_run(self, first_queue_offset: int, entries: bytes, allow_prefill: bool) -> int:
        """Append packed entries at consecutive queue offsets from ``first_queue_offset`` on:
        what ``put`` of each entry in turn would write, in one copy per file. The entries this
        queue already holds are DUPLICATEs and skipped; GAP (nothing written) when entries are
        missing before the first new one."""
        with self._lock:
            mfq = self.mfq
            n = len(entries) // ENTRY_SIZE
            skip = max(0, mfq.max_offset // ENTRY_SIZE - first_queue_offset) if mfq.files else 0
            while skip < n:  # a replay's entries, known by their CommitLog position
                phy, size, _ = ENTRY.unpack_from(entries, skip * ENTRY_SIZE)
                if phy + size > self.max_physic_offset:
                    break
                skip += 1
            if skip == n:
                return DUPLICATE
            expected = (first_queue_offset + skip) * ENTRY_SIZE
            if not mfq.files and expected:
                if not allow_prefill:
                    return GAP
                self._prefill(mfq, expected)
            if expected != mfq.max_offset:
                return GAP if expected > mfq.max_offset else DUPLICATE
            with memoryview(entries) as view:
                rest = view[skip * ENTRY_SIZE :]
                at = expected
                while rest:
                    f = mfq.file_for_append(at)
                    take = min(len(rest), f.size - f.wrote)
                    f.mm[f.wrote : f.wrote + take] = rest[:take]
                    f.wrote += take
                    at += take
                    rest = rest[take:]
            phy, size, _ = ENTRY.unpack_from(entries, (n - 1) * ENTRY_SIZE)
            self.max_physic_offset = phy + size
            self._wrote(mfq)
            return WRITTEN

    def _prefill(self, mfq: MappedFileQueue, expected: int) -> None:
        f = mfq.file_for_append(expected)
        pad = expected - f.base_offset
        if pad:
            f.mm[0:pad] = BLANK_ENTRY * (pad // ENTRY_SIZE)
        f.wrote = pad
        self.min_logic_byte = expected

    # ----------------------------------------------------------------- read
    def get(self, queue_offset: int) -> tuple[int, int, int] | None:
        pos = queue_offset * ENTRY_SIZE
        with self._lock:
            f = self.mfq.find_file(pos)
            if f is None or pos - f.base_offset >= f.wrote:
                return None
            e: tuple[int, int, int] = ENTRY.unpack_from(f.mm, pos - f.base_offset)
            return e

    def read(self, queue_offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to ``max_count`` entries from ``queue_offset`` (fewer at a file end or the head)."""
        pos = queue_offset * ENTRY_SIZE
        with self._lock:
            f = self.mfq.find_file(pos)
            if f is None:
                return []
            start = pos - f.base_offset
            stop = min(f.wrote, start + max_count * ENTRY_SIZE)
            if stop <= start:
                return []
            return list(ENTRY.iter_unpack(f.mm[start:stop]))

    def read_raw(self, queue_offset: int, max_count: int) -> bytes:
        """``read``'s entries as the file holds them, packed (20 bytes each): for a reader that
        hands them to compiled code rather than unpacking each."""
        pos = queue_offset * ENTRY_SIZE
        with self._lock:
            f = self.mfq.find_file(pos)
            if f is None:
                return b""
            start = pos - f.base_offset
            stop = min(f.wrote, start + max_count * ENTRY_SIZE)
            if stop <= start:
                return b""
            return f.mm[start:stop]

    def _bsearch(self, lo: int, hi: int, pred: Callable[[int], bool]) -> int:
        """First queue offset in [lo, hi) where pred holds (pred monotone), else hi."""
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _phy_at_least(self, phy_offset: int) -> Callable[[int], bool]:
        def pred(q: int) -> bool:
            e = self.get(q)
            return e is None or (not is_blank(e[0], e[1]) and e[0] >= phy_offset)

        return pred

    def offset_by_time(self, timestamp_ms: int, store_time_of: Callable[[int, int], int]) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``."""

        def pred(q: int) -> bool:
            e = self.get(q)
            if e is None:
                return True
            if is_blank(e[0], e[1]):
                return False
            return store_time_of(e[0], e[1]) >= timestamp_ms

        with self._lock:
            return self._bsearch(self.min_offset, self.max_offset, pred)

    # ----------------------------------------------------------------- truncate / retention
    def truncate_phy(self, phy_offset: int) -> None:
        """Remove every entry pointing at or beyond ``phy_offset`` (zeroed, not just forgotten)."""
        with self._lock:
            mfq = self.mfq
            if self.max_physic_offset <= phy_offset and self.max_physic_offset >= 0:
                return
            cut_q = self._bsearch(self.min_offset, self.max_offset, self._phy_at_least(phy_offset))
            cut = cut_q * ENTRY_SIZE
            if cut >= mfq.max_offset:
                return
            mfq.truncate(cut)
            mfq.set_positions(cut)
            if not mfq.files:
                self.min_logic_byte = 0
            self.max_physic_offset = self._scan_max_phy()

    def correct_min_offset(self, commitlog_min: int) -> None:
        with self._lock:
            self.min_logic_byte = ENTRY_SIZE * self._bsearch(
                self.min_offset, self.max_offset, self._phy_at_least(commitlog_min)
            )

    def delete_expired(self, commitlog_min: int) -> int:
        """Delete head files whose last entry points below the CommitLog's minimum offset."""
        with self._lock:
            mfq = self.mfq
            count = 0
            for f in mfq.files[:-1]:
                (phy, size, _) = ENTRY.unpack_from(f.mm, f.size - ENTRY_SIZE)
                if phy + size > commitlog_min and not is_blank(phy, size):
                    break
                count += 1
            deleted = len(mfq.delete_head(count))
            self.correct_min_offset(commitlog_min)
            return deleted

    def flush(self, least_pages: int = 0) -> None:
        with self._lock:
            self.mfq.flush(least_pages)

    def close(self) -> None:
        with self._lock:
            if self._mfq is not None:
                self._mfq.close()
