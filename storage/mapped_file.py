"""One fixed-size, preallocated, memory-mapped file whose name is the 20-digit global offset of
its first byte.

Three positions per file (spec §4.1): ``wrote`` (bytes appended), ``committed`` (bytes in the
file, which is what readers map) and ``flushed`` (bytes known durable), wrote >= committed >=
flushed. Without a write buffer (the transient store pool, ``storage.transient_pool``) appends go
straight into the file and committed is wrote. With one, appends go to the buffer and ``commit``
copies them into the file. Readers see up to ``committed``; a flush makes durable what is
committed.

Files are created with their blocks reserved (``storage.allocate``), never sparse.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable

from tidemq.storage import pages
from tidemq.storage.allocate import allocate
from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.record import BLANK_SIZE, write_blank
from tidemq.storage.transient_pool import WriteBuffer

PAGE_SIZE = mmap.PAGESIZE
_ZERO_CHUNK = bytes(1 << 20)
# Reads that stand in for MADV_POPULATE_* on kernels without it: one per chunk.
_FALLBACK_CHUNK_BYTES = 4 << 20


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


PWRITE_MIN_BYTES = 64 << 10


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    rest = data
    while rest:  # a regular file writes short only when a signal interrupts it
        n = os.pwrite(fd, rest, pos)
        pos += n
        rest = rest[n:]


class MappedFile:
    def __init__(self, path: str, size: int, base_offset: int, *, writable: bool = True) -> None:
        actual = os.path.getsize(path)
        if actual != size:
            raise CorruptStoreError(f"{path} is {actual} bytes, the store expects {size}")
        self.path = path
        self.size = size
        self.base_offset = base_offset
        self.writable = writable
        self._fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(self._fd, size, access=access)
        # A loaded file counts as full until recovery says where its data ends (spec §1.1).
        self.wrote = size
        self.flushed = size
        self.closed = False
        # Held around every native call on the mapping or write through the descriptor from a
        # thread other than the writer's (warming, mlock, commits) and by ``close``: the mapping
        # is never unmapped, nor the descriptor number reused, under such a call.
        self._io_lock = threading.Lock()
        self._addr = -1  # where the mapping starts, once a native call needed it
        self.locked = False  # mlock accepted for the whole mapping
        # The transient store pool's buffer while the file has one; None: appends go straight
        # into the file.
        self._buffer: WriteBuffer | None = None
        self._give_back: Callable[[WriteBuffer], None] | None = None
        self._committed = size  # with a buffer: bytes copied into the file
        self._data_end = size  # with a buffer: where its bytes end (a blank marker ends early)

    @classmethod
    def create(cls, path: str, size: int, base_offset: int) -> MappedFile:
        allocate(path, size)
        f = cls(path, size, base_offset)
        f.wrote = 0
        f.flushed = 0
        return f

    def advise_appending(self, appending: bool) -> None:
        """No readahead while the file is appended to: its readers (dispatch, the newest pulls)
        read what was just written, which is in the page cache, so a read fault there only
        starts readahead of the pages ahead of the writer, each allocated and zero-filled in
        the reader's thread before the writer overwrites it (on the development VM that cost
        the dispatch thread more than the whole rest of a put). Readahead comes back for a full
        file, whose readers are consumers catching up on old data."""
        if not self.closed:
            self.mm.madvise(mmap.MADV_RANDOM if appending else mmap.MADV_NORMAL)

    # ----------------------------------------------------------------- positions
    @property
    def committed(self) -> int:
        """Bytes in the file: what readers may see (all that was written without a buffer)."""
        return self.wrote if self._buffer is None else self._committed

    def set_positions(self, pos: int) -> None:
        """Wrote, committed and flushed all at ``pos`` (recovery, truncation)."""
        self._committed = pos
        self._data_end = self.size
        self.wrote = self.flushed = pos

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @property
    def is_full(self) -> bool:
        return self.wrote >= self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    @property
    def has_buffer(self) -> bool:
        return self._buffer is not None

    # ----------------------------------------------------------------- writes
    def write_at(self, pos: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``pos``: into the write buffer when the file has one, else into the
        file. A large write to the file goes through the file descriptor: the pages are the
        same page-cache pages readers map, but ``pwrite`` takes no page fault per page and
        releases the GIL while it copies. A small one is a copy into the mapping: giving up
        the GIL for a few KiB would cost more than the copy (a thread that gives it up waits
        for it again behind every busy thread, with the put lock held)."""
        if pos < 0 or pos + len(data) > self.size:
            raise ValueError(f"write of {len(data)} bytes at {pos} outside {self.path}")
        buf = self._buffer
        if buf is not None:
            # Pre-faulted, locked memory: a copy that never waits for a page (a large one is a
            # pwrite to the buffer's memfd, releasing the GIL as below).
            buf.write(pos, data)
            return
        if len(data) < PWRITE_MIN_BYTES:
            self.mm[pos : pos + len(data)] = data
            return
        with memoryview(data) as whole:
            _pwrite_all(self._fd, whole, pos)

    def write_blank_end(self, pos: int) -> None:
        """End the file at ``pos`` with the 8-byte blank marker (the next record does not fit in
        the rest) and mark it full. Every writer of a blank marker goes through here: with a
        write buffer, the marker must go to the buffer, and a commit copies the file's bytes
        only up to the marker's end (the buffer's bytes past it are an earlier file's)."""
        buf = self._buffer
        if buf is not None:
            self._data_end = pos + BLANK_SIZE  # before wrote moves: a commit reads both
            write_blank(buf.mm, pos, self.size - pos)
        else:
            write_blank(self.mm, pos, self.size - pos)
        self.wrote = self.size

    # ----------------------------------------------------------------- transient store pool
    def attach_buffer(self, buf: WriteBuffer, give_back: Callable[[WriteBuffer], None]) -> None:
        """Append into ``buf`` from here on (the file's bytes so far stay as they are); the
        buffer goes back through ``give_back`` once the file is full and wholly committed, or
        closed."""
        if buf.size != self.size:
            raise ValueError(f"a {buf.size}-byte buffer for the {self.size}-byte {self.path}")
        self._committed = self.wrote
        self._data_end = self.size
        self._give_back = give_back
        self._buffer = buf

    def commit(self, least_pages: int = 0) -> int:
        """Copy the bytes appended to the write buffer since the last commit into the file;
        returns the committed position. ``least_pages`` > 0 skips a commit of fewer whole pages
        unless the file is full. Callers serialise commits (``MappedFileQueue.commit``); the
        writer may append meanwhile, past what this copies.

        The copy writes its first 8 bytes last, as ``commitlog.write_records`` does: until the
        commit ends, the file's data ends with zeros where the new bytes begin, so a process
        killed part-way leaves nothing that recovery could take for whole records."""
        with self._io_lock:
            buf = self._buffer
            if buf is None or self.closed:
                return self.committed
            wrote = self.wrote
            done = self._committed
            if wrote > done:
                if (
                    least_pages
                    and wrote < self.size
                    and wrote // PAGE_SIZE - done // PAGE_SIZE < least_pages
                ):
                    return done
                end = min(wrote, self._data_end)
                if end > done:
                    with memoryview(buf.mm) as view:
                        if end - done > BLANK_SIZE:
                            _pwrite_all(self._fd, view[done + BLANK_SIZE : end], done + BLANK_SIZE)
                            _pwrite_all(self._fd, view[done : done + BLANK_SIZE], done)
                        else:
                            _pwrite_all(self._fd, view[done:end], done)
                self._committed = wrote
            if wrote >= self.size:
                self._release_buffer()
            return wrote

    def take_buffer(self) -> WriteBuffer | None:
        """Detach the write buffer, if everything in it is committed (the caller holds the
        commit lock and the put lock), and return it; the file goes on directly."""
        with self._io_lock:
            buf = self._buffer
            if buf is None or self._committed < self.wrote:
                return None
            self._buffer = self._give_back = None
            return buf

    def _release_buffer(self) -> None:
        """Give the buffer back (the caller holds the I/O lock). What was not committed is
        gone: callers commit first, except a close that gives up on the bytes."""
        buf, give_back = self._buffer, self._give_back
        if buf is None or give_back is None:
            return
        self._committed = self.wrote
        self._buffer = self._give_back = None
        give_back(buf)

    # ----------------------------------------------------------------- pages
    def _address(self) -> int:
        if self._addr < 0:
            self._addr = pages.address_of(self.mm)
        return self._addr

    def map_in(self, pos: int, length: int) -> None:
        """Map [pos, pos + length) of what the file holds into this process with one call
        (``MADV_POPULATE_READ``, the GIL released) before a reader walks it: one fault per page
        otherwise, each a trap into the kernel (and, on a VM, out of it), which cost the
        dispatch of replicated bytes more than checking them. Only an optimisation: a refusal
        leaves the reader to fault them in."""
        if length <= 0:
            return
        with self._io_lock:
            if self.closed:
                return
            start = pos - pos % PAGE_SIZE
            pages.populate(self._address() + start, pos + length - start, write=False)

    def warm(self, pos: int, length: int, scratch: bytearray | None = None) -> bool:
        """Bring [pos, pos + length) of the file into the page cache, ahead of the writes (see
        storage.warm); False if the file is closed or the kernel refused.

        ``MADV_POPULATE_READ``, in one call that releases the GIL: the page-cache pages are
        found (the expensive part of a first write) and mapped, without being dirtied.
        ``MADV_POPULATE_WRITE`` would also map them writable, saving the writer a cheap
        write-protect fault per page, but it dirties them: a flush (which writes back every
        dirty page of the file) then writes the zeros ahead of the writer, and the data again
        later, about twice the disk writes at a moderate write rate. Where the kernel lacks
        MADV_POPULATE_* (before 5.14): ``MADV_WILLNEED`` and a read of the range into
        ``scratch`` (reads of an unwritten extent allocate clean zero pages)."""
        length = min(length, self.size - pos)
        if length <= 0 or not self.writable:
            return False
        with self._io_lock:
            if self.closed:
                return False
            addr = self._address()
            err = pages.populate(addr + pos, length, write=False)
            if err == 0:
                return True
            if err != errno.EINVAL:
                return False
            # No MADV_POPULATE_*: readahead started for the range, then reads that wait for it.
            pages.madvise(addr + pos, length, pages.MADV_WILLNEED)
            if scratch is None:
                scratch = bytearray(min(length, _FALLBACK_CHUNK_BYTES))
            end = pos + length
            while pos < end:  # chunks of MiB, not pages; only where the kernel lacks populate
                n = min(len(scratch), end - pos)
                with memoryview(scratch) as view:
                    got = os.preadv(self._fd, [view[:n]], pos)
                if got <= 0:
                    break
                pos += got
            return True

    def lock(self) -> int:
        """mlock the whole mapping (its pages are faulted in and stay in memory); the errno of a
        refusal, else 0."""
        with self._io_lock:
            if self.closed or self.locked or not self.writable:
                return 0
            err = pages.mlock(self._address(), self.size)
            self.locked = err == 0
            return err

    def unlock(self) -> None:
        with self._io_lock:
            if self.closed or not self.locked:
                return
            pages.munlock(self._address(), self.size)
            self.locked = False

    # ----------------------------------------------------------------- flush
    def flush(self) -> int:
        """Make everything committed durable; returns the new flushed position.

        fdatasync rather than mmap.flush (msync): CPython holds the GIL through msync, which
        would freeze every producer for the length of each write-back; fdatasync releases it, and
        on Linux it writes back pages dirtied through a shared mapping just the same.
        """
        done = self.committed
        if done > self.flushed and self.writable:
            os.fdatasync(self._fd)
            self.flushed = done
        return self.flushed

    def dup_for_sync(self) -> tuple[int, int] | None:
        """(a duplicate of the descriptor, the committed position) for a flush made without
        holding the file's owner's lock: the duplicate stays valid if the file is closed
        meanwhile (the caller closes it). None when there is nothing to flush."""
        done = self.committed
        if done <= self.flushed or not self.writable or self.closed:
            return None
        return os.dup(self._fd), done

    def dirty_pages(self) -> int:
        return (self.committed - self.flushed) // PAGE_SIZE

    def tail_bytes(self, pos: int, data_end: int | None = None) -> bytes:
        """The bytes in [pos, end of data): exactly up to ``data_end`` when given.

        Otherwise (recovery, where a crashed writer left a tail of unknown length) data runs
        until the first wholly zero megabyte: files start zeroed, truncation always zeroes, and
        what a crash leaves is contiguous. Reading forward keeps the common case, a clean end
        followed by the unused rest of a large file, to one megabyte instead of the whole rest.
        """
        if data_end is not None:
            return bytes(self.mm[pos:data_end])
        chunk = len(_ZERO_CHUNK)
        end = pos
        while end < self.size:
            nxt = min(self.size, end + chunk)
            if self.mm[end:nxt] == _ZERO_CHUNK[: nxt - end]:
                break
            end = nxt
        if end <= pos:
            return b""
        return bytes(self.mm[pos:end]).rstrip(b"\x00")

    def zero(self, pos: int, length: int) -> None:
        """Zero [pos, pos + length) durably."""
        if length <= 0:
            return
        self.mm[pos : pos + length] = bytes(length)
        os.fdatasync(self._fd)

    def close(self) -> None:
        with self._io_lock:
            if self.closed:
                return
            self.closed = True
            self._release_buffer()
            self.locked = False  # unmapping unlocks
            self.mm.close()
            os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.path!r}, wrote={self.wrote}, committed={self.committed}, "
            f"flushed={self.flushed})"
        )
