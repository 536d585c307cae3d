"""The pending timers of a broker, on disk: RocketMQ's TimerWheel + TimerLog in small.

No Python object is held per pending timer. An append-only **entry log** file holds one 32-byte
entry per timer (due ms, seq, timer id, the previous entry of its slot), written and read with
``pwrite``/``pread`` (page cache, not the heap, and not this process's RSS); the **wheel** is
``slots`` chain heads, counts and earliest dues in ``array`` (a few bytes per slot). A timer
goes on the chain of slot ``(due // slot_ms) % slots``. Popping walks time forward one slot
window at a time: a window's chain is read once when the window starts, its entries due in the
window move to a small sorted in-memory list (bounded by one window's timers, plus any added
late for a time already passed), and the chain's other entries, due a whole turn or more
later, are chained again. Entries come out in (due, seq) order, each once.

The wheel is a cache: the broker clears it and adds every pending ``%SYS%TIMER`` record at start
and on promotion, so nothing here is fsynced or recovered. The space of fired entries is
reclaimed by compacting the entry log (live entries copied to a new file) once most of it is
garbage.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from typing import Final

_ENTRY = struct.Struct(">qqqq")  # due_ms, seq, timer_id, previous entry index (-1: none)
ENTRY_BYTES: Final = _ENTRY.size
_NONE: Final = -1
_NO_DUE: Final = (1 << 63) - 1
_WRITE_BATCH: Final = 4096  # entries gathered in memory before one pwrite
_COMPACT_MIN_ENTRIES: Final = 1 << 16
LOG_NAME: Final = "timerlog"

Timer = tuple[int, int, int]  # (due_ms, seq, timer_id)


class TimerWheel:
    """Pending timers of one broker. Not thread-safe: one caller at a time (the timer service's
    loop); opening it empties its directory's entry log."""

    def __init__(self, directory: str, *, slot_ms: int = 1000, slots: int = 3600) -> None:
        if slot_ms <= 0 or slots <= 0:
            raise ValueError("slot_ms and slots must be positive")
        self.slot_ms = slot_ms
        self.slots = slots
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(directory, LOG_NAME)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._reset()

    def _reset(self) -> None:
        self._heads = array("q", [_NONE]) * self.slots
        self._counts = array("q", [0]) * self.slots
        self._min_due = array("q", [_NO_DUE]) * self.slots
        self._min_seq = array("q", [_NO_DUE]) * self.slots
        self._chained = 0
        self._entries = 0  # entries in the log, written or buffered
        self._buffer = bytearray()
        self._buffer_start = 0  # entry index of the buffer's first entry
        # Everything due before the frontier is in ``_ready``, sorted; the chains hold the rest.
        # None until the first pop: timers added before it (a rebuild) may lie in the past.
        self._frontier: int | None = None
        self._ready: list[Timer] = []
        self._ready_pos = 0

    def close(self) -> None:
        os.close(self._fd)

    def clear(self) -> None:
        """Forget every timer (before a rebuild) and give the entry log's space back."""
        os.ftruncate(self._fd, 0)
        self._reset()

    # ---- adding ----

    def add(self, due_ms: int, seq: int, timer_id: int) -> None:
        if self._frontier is not None and due_ms < self._frontier:
            bisect.insort(self._ready, (due_ms, seq, timer_id), lo=self._ready_pos)
            return
        self._chain(due_ms, seq, timer_id)

    def _chain(self, due_ms: int, seq: int, timer_id: int) -> None:
        s = (due_ms // self.slot_ms) % self.slots
        self._buffer += _ENTRY.pack(due_ms, seq, timer_id, self._heads[s])
        self._heads[s] = self._entries
        self._entries += 1
        self._counts[s] += 1
        self._chained += 1
        self._min_due[s] = min(self._min_due[s], due_ms)
        self._min_seq[s] = min(self._min_seq[s], seq)
        if len(self._buffer) >= _WRITE_BATCH * ENTRY_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            os.pwrite(self._fd, self._buffer, self._buffer_start * ENTRY_BYTES)
            self._buffer_start = self._entries
            self._buffer = bytearray()

    # ---- reading ----

    @property
    def pending_count(self) -> int:
        return self._chained + len(self._ready) - self._ready_pos

    def next_due_ms(self) -> int | None:
        """The earliest due time pending (None: nothing pending)."""
        due = min(self._min_due) if self._chained else _NO_DUE
        if self._ready_pos < len(self._ready):
            due = min(due, self._ready[self._ready_pos][0])
        return None if due == _NO_DUE else due

    def low_seq(self) -> int | None:
        """The lowest seq pending (None: nothing pending): every seq below it that was added
        has been popped. What the broker's Fired event and retention pin are built from."""
        low = min(self._min_seq) if self._chained else _NO_DUE
        for _due, seq, _id in self._ready[self._ready_pos :]:
            low = min(low, seq)
        return None if low == _NO_DUE else low

    def pop_due(self, now_ms: int, max_entries: int) -> list[Timer]:
        """Up to ``max_entries`` timers due at or before ``now_ms``, in (due, seq) order; each
        timer is returned once, and the ones not returned stay pending."""
        if max_entries <= 0:
            return []
        self._advance(now_ms, max_entries)
        ready, start = self._ready, self._ready_pos
        end = min(len(ready), start + max_entries)
        if end > start and ready[end - 1][0] > now_ms:
            end = bisect.bisect_right(ready, (now_ms, _NO_DUE, _NO_DUE), start, end)
        out = ready[start:end]
        self._ready_pos = end
        if self._ready_pos > 1024 and self._ready_pos * 2 > len(ready):
            del ready[: self._ready_pos]
            self._ready_pos = 0
        self._maybe_compact()
        return out

    def _ready_enough(self, now_ms: int, want: int) -> bool:
        i = self._ready_pos + want - 1
        return i < len(self._ready) and self._ready[i][0] <= now_ms

    def _advance(self, now_ms: int, want: int) -> None:
        """Move the frontier over every slot window started by ``now_ms`` (or until ``want``
        timers due by then are ready)."""
        if self._frontier is None:
            first = self.next_due_ms()
            start = now_ms if first is None else min(first, now_ms)
            self._frontier = start - start % self.slot_ms
        while self._frontier <= now_ms and not self._ready_enough(now_ms, want):
            s = (self._frontier // self.slot_ms) % self.slots
            if not self._counts[s]:
                # Jump over empty windows: no chained timer is due before the earliest one.
                # Never past the window after now's: what is added for a time before the
                # frontier is kept in memory, and that must stay one window's worth.
                target = now_ms - now_ms % self.slot_ms + self.slot_ms
                if self._chained:
                    first = min(self._min_due)
                    target = min(target, first - first % self.slot_ms)
                self._frontier = max(self._frontier + self.slot_ms, target)
                continue
            self._load(s, self._frontier + self.slot_ms)
            self._frontier += self.slot_ms

    def _load(self, s: int, window_end: int) -> None:
        """Move slot ``s``'s timers due before ``window_end`` to the ready list; chain the rest
        again (they are due a whole turn of the wheel or more later)."""
        later: list[Timer] = []
        due_now: list[Timer] = []
        for due, seq, timer_id in self._walk(self._heads[s]):
            (due_now if due < window_end else later).append((due, seq, timer_id))
        self._chained -= self._counts[s]
        self._heads[s] = _NONE
        self._counts[s] = 0
        self._min_due[s] = _NO_DUE
        self._min_seq[s] = _NO_DUE
        for t in later:
            self._chain(*t)
        if due_now:
            rest = self._ready[self._ready_pos :]
            rest.extend(due_now)
            rest.sort()
            self._ready = rest
            self._ready_pos = 0

    def _walk(self, index: int) -> list[Timer]:
        """The timers of one chain, from its head."""
        return _walk(index, self._fd, self._path, self._buffer, self._buffer_start)

    # ---- reclaiming space ----

    @property
    def log_entries(self) -> int:
        """Entries in the entry log, live or fired (its size is this times ``ENTRY_BYTES``)."""
        return self._entries

    def _maybe_compact(self) -> None:
        if self._chained == 0 and self._entries:
            self._flush()
            os.ftruncate(self._fd, 0)
            self._entries = self._buffer_start = 0
            return
        if self._entries >= _COMPACT_MIN_ENTRIES and self._entries > 4 * self._chained:
            self.compact()

    def compact(self) -> None:
        """Copy the live entries to a new entry log, one chain at a time, and drop the old one."""
        self._flush()
        old_fd, old_heads, old_counts = self._fd, self._heads, self._counts
        tmp = self._path + ".new"
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._heads = array("q", [_NONE]) * self.slots
        self._counts = array("q", [0]) * self.slots
        self._min_due = array("q", [_NO_DUE]) * self.slots
        self._min_seq = array("q", [_NO_DUE]) * self.slots
        self._chained = self._entries = self._buffer_start = 0
        try:
            for s in range(self.slots):
                if old_counts[s]:
                    chain = _walk(old_heads[s], old_fd, self._path, bytearray(), 1 << 62)
                    for t in reversed(chain):  # oldest first, as they were added
                        self._chain(*t)
            self._flush()
            os.replace(tmp, self._path)
        finally:
            os.close(old_fd)


def _walk(index: int, fd: int, path: str, buffer: bytearray, buffer_start: int) -> list[Timer]:
    """The timers of the chain starting at entry ``index``: from ``buffer`` (not yet written,
    entries from ``buffer_start`` on), else from the file."""
    out: list[Timer] = []
    while index != _NONE:
        if index >= buffer_start:
            due, seq, timer_id, index = _ENTRY.unpack_from(
                buffer, (index - buffer_start) * ENTRY_BYTES
            )
        else:
            raw = os.pread(fd, ENTRY_BYTES, index * ENTRY_BYTES)
            if len(raw) != ENTRY_BYTES:
                raise OSError(f"timer log {path} ends before entry {index}")
            due, seq, timer_id, index = _ENTRY.unpack(raw)
        out.append((due, seq, timer_id))
    return out
