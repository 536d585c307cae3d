"""RocketMQ's TransientStorePool (``transient_store_pool_enable``): write buffers for the CommitLog
files being written, in memory the page cache does not own.

Each buffer is memory of one CommitLog file's size (a memfd, ``WriteBuffer``), faulted in whole at
start (``MADV_POPULATE_WRITE``, one call) and locked (``mlock``), so a writer copying records into
it never waits for the kernel to find a page. A new CommitLog file borrows a buffer
(``MappedFileQueue.create_file``); its records are appended there, and a commit (the
``commitlog-commit`` thread, or a flush) copies the new bytes into the file with ``pwrite``, which
releases the GIL. Readers keep reading the mapped file, so they see only what was committed. A
file gives its buffer back once it is full and wholly committed, and the next file reuses it.

With no buffer free when a file is created (commits far behind, or fewer buffers than the files
one batch spans), everything pending is committed at once and the files holding buffers give them
back and go on directly, as without a pool; the new file takes one (``pool_misses`` counts
these). RocketMQ writes the new file directly instead, which here could put later bytes on disk
before earlier ones still in a buffer.

What it costs: ``transient_store_pool_buffers`` x the CommitLog file size of locked memory (shown
as shared memory, RssShmem) for as long as the store is open (RocketMQ's default, 5 x 1 GiB),
and one more copy of every record. The buffers are made and faulted in when the store opens.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading

from tidemq.storage import pages
from tidemq.storage.pages import PageCounters

# A copy into a buffer at least this large is a pwrite, which releases the GIL (as for files).
PWRITE_MIN_BYTES = 64 << 10

log = logging.getLogger(__name__)


class WriteBuffer:
    """One buffer: a memfd of ``size`` bytes, mapped once. A memfd rather than plain anonymous
    memory so that a large copy into it can be a ``pwrite``, which releases the GIL as the
    direct path's large writes do (a copy into a mapping holds it); small copies go into the
    mapping."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("tidemq-transient-store-pool", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def write(self, pos: int, data: bytes | memoryview) -> None:
        if len(data) < PWRITE_MIN_BYTES:
            self.mm[pos : pos + len(data)] = data
            return
        with memoryview(data) as view:
            rest = view
            while rest:
                n = os.pwrite(self.fd, rest, pos)
                pos += n
                rest = rest[n:]

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class TransientStorePool:
    """``buffers`` write buffers of ``buffer_bytes`` each. Thread-safe: files borrow in the
    writer's thread and give back in the commit thread."""

    def __init__(self, buffers: int, buffer_bytes: int, counters: PageCounters) -> None:
        self.buffers = buffers
        self.buffer_bytes = buffer_bytes
        self._counters = counters
        self._lock = threading.Lock()
        self._free: list[WriteBuffer] = []
        self._all: list[WriteBuffer] = []
        self._locked: set[int] = set()  # ids of the buffers mlock accepted
        self.misses = 0  # new files that found no buffer free
        self.borrows = 0

    def init(self) -> None:
        """Make, fault in and lock every buffer (heavy: the whole pool's memory, once)."""
        for _ in range(self.buffers - len(self._all)):
            buf = WriteBuffer(self.buffer_bytes)
            addr = pages.address_of(buf.mm)
            if pages.populate(addr, self.buffer_bytes, write=True):
                # No MADV_POPULATE_WRITE: one memset touches every page just the same.
                ctypes.memset(addr, 0, self.buffer_bytes)
            err = pages.mlock(addr, self.buffer_bytes)
            if err:
                self._counters.mlock_failed("a transient store pool buffer", err)
            else:
                self._locked.add(id(buf))
            with self._lock:
                self._all.append(buf)
                self._free.append(buf)

    @property
    def made(self) -> int:
        """Buffers made so far (all of them once ``init`` ran)."""
        return len(self._all)

    @property
    def free(self) -> int:
        return len(self._free)

    def borrow(self) -> WriteBuffer | None:
        """A free buffer, or None when every one is in use. The buffer holds an earlier file's
        bytes: only what a file writes into it is ever committed."""
        with self._lock:
            if not self._free:
                return None
            self.borrows += 1
            return self._free.pop()

    def note_miss(self) -> None:
        """A new file found no buffer free (counted; logged the first time)."""
        with self._lock:
            self.misses += 1
            first = self.misses == 1
        if first:
            log.warning(
                "transient store pool: all %d buffers in use when a CommitLog file was created "
                "(commits behind the writers, or a pool too small); pending bytes were "
                "committed at once to free one. Later misses are only counted",
                self.buffers,
            )

    def give_back(self, buf: WriteBuffer) -> None:
        with self._lock:
            self._free.append(buf)

    def close(self) -> None:
        """Unlock and free every buffer; every file must have given its buffer back (they do
        as they close)."""
        with self._lock:
            bufs, self._all, self._free = self._all, [], []
        for buf in bufs:
            if id(buf) in self._locked:
                pages.munlock(pages.address_of(buf.mm), self.buffer_bytes)
            buf.close()
        self._locked.clear()
