"""One fixed-size, preallocated, memory-mapped file whose name is the 20-digit global offset of
its first byte.

Three positions per file (spec §4.1): ``wrote`` (bytes appended), ``committed`` (equal to wrote:
we have no TransientStorePool) and ``flushed`` (bytes known durable). Readers see up to ``wrote``.

Files are created with their blocks reserved (``storage.allocate``), never sparse.
"""

from __future__ import annotations

import contextlib
import mmap
import os

from tidemq.storage.allocate import allocate
from tidemq.storage.errors import CorruptStoreError

PAGE_SIZE = mmap.PAGESIZE
_ZERO_CHUNK = bytes(1 << 20)


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


PWRITE_MIN_BYTES = 64 << 10


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

    @classmethod
    def create(cls, path: str, size: int, base_offset: int) -> MappedFile:
        allocate(path, size)
        f = cls(path, size, base_offset)
        f.wrote = 0
        f.flushed = 0
        return f

    def write_at(self, pos: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``pos``. A large write goes through the file descriptor: the pages
        are the same page-cache pages readers map, but ``pwrite`` takes no page fault per page
        and releases the GIL while it copies. A small one is a copy into the mapping: giving up
        the GIL for a few KiB would cost more than the copy (a thread that gives it up waits
        for it again behind every busy thread, with the put lock held)."""
        if pos < 0 or pos + len(data) > self.size:
            raise ValueError(f"write of {len(data)} bytes at {pos} outside {self.path}")
        if len(data) < PWRITE_MIN_BYTES:
            self.mm[pos : pos + len(data)] = data
            return
        with memoryview(data) as whole:
            rest = whole
            while rest:  # a regular file writes short only when a signal interrupts it
                n = os.pwrite(self._fd, rest, pos)
                pos += n
                rest = rest[n:]

    def warm(self, pos: int, buf: bytearray) -> bool:
        """Read ``len(buf)`` bytes from ``pos`` into the page cache (see storage.warm); False if
        the file is closed. ``preadv`` releases the GIL, so a warming thread costs writers
        nothing but a core they would not use."""
        if self.closed:
            return False
        try:
            os.preadv(self._fd, [buf], pos)
        except OSError:  # closed concurrently; warming is only an optimisation
            return False
        return True

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @property
    def is_full(self) -> bool:
        return self.wrote >= self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    def flush(self) -> int:
        """Make everything written durable; returns the new flushed position.

        fdatasync rather than mmap.flush (msync): CPython holds the GIL through msync, which
        would freeze every producer for the length of each write-back; fdatasync releases it, and
        on Linux it writes back pages dirtied through a shared mapping just the same.
        """
        wrote = self.wrote
        if wrote > self.flushed and self.writable:
            os.fdatasync(self._fd)
            self.flushed = wrote
        return self.flushed

    def dirty_pages(self) -> int:
        return (self.wrote - self.flushed) // PAGE_SIZE

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
        if self.closed:
            return
        self.closed = True
        self.mm.close()
        os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, wrote={self.wrote}, flushed={self.flushed})"
