"""Page-cache warming ahead of the CommitLog's write position (RocketMQ's warmMappedFile, done
differently).

On this kind of machine the first write to a page of a fresh, preallocated file costs far more
than the copy itself: the kernel allocates a page-cache page for it (and the hypervisor backs
that memory) inside the write, with the writer waiting for it. Measured on 1 KiB records:
about 0.5-2.5 us per record cold against 0.2 us once the page is in the cache; it was the
largest single cost of a put.

A ``PageWarmer`` thread keeps the range just ahead of the writer in the page cache with one
``madvise(MADV_POPULATE_READ)`` per chunk (``MappedFile.warm``), called through ctypes so the GIL
is free while the kernel works: the work runs on another core while the writer keeps going, and
no Python code runs per page. The pages are found and mapped but stay clean, so, unlike
RocketMQ's zero writes or ``MADV_POPULATE_WRITE``, warming adds no disk writes (a flush writes
back every dirty page of the file, zeros ahead of the writer included). Where the kernel lacks
MADV_POPULATE_* (before 5.14) it falls back to ``MADV_WILLNEED`` and ``os.preadv`` into a scratch
buffer, which does the same with a copy. ``POSIX_FADV_WILLNEED`` alone is not enough: it
populates only a readahead window of a few MiB. Clean pages may be reclaimed under memory
pressure, which only brings the slow faults back.

Chunks are 4 MiB: between two calls the thread waits for the GIL, up to the interpreter's 5 ms
switch interval while a writer runs, so small chunks would cap warming below the write rate.

``next_warm_range`` is the decision alone, without files or threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from tidemq.storage import pages

log = logging.getLogger(__name__)


class Warmable(Protocol):
    size: int
    wrote: int

    def warm(self, pos: int, length: int, scratch: bytearray | None = None) -> bool: ...


def next_warm_range(wrote: int, warmed: int, size: int, ahead_bytes: int, chunk_bytes: int) -> int:
    """Where to warm next so that [wrote, wrote + ahead_bytes) of a ``size``-byte file is warm,
    given that [.., warmed) already is; -1 when nothing needs warming.

    Chunks start on chunk boundaries, and a writer that overtook the warmer (a burst) moves the
    start to its own position: warming behind the writer is wasted."""
    start = max(warmed, wrote - wrote % chunk_bytes)
    if start >= min(size, wrote + ahead_bytes):
        return -1
    return start


class PageWarmer:
    """One daemon thread warming the file ``current()`` names, ``ahead_bytes`` ahead."""

    def __init__(
        self,
        current: Callable[[], Warmable | None],
        *,
        ahead_bytes: int,
        chunk_bytes: int = 4 << 20,
        idle_s: float = 0.01,
    ) -> None:
        self._current = current
        self.ahead_bytes = ahead_bytes
        self.chunk_bytes = chunk_bytes
        self._idle_s = idle_s
        self._stop = threading.Event()
        self._resumed = threading.Event()  # set when ahead_bytes turns non-zero, or at stop
        self._thread = threading.Thread(target=self._run, name="commitlog-warm", daemon=True)
        # What is warm: (the file, the end of its warm range). Read by tests and stats.
        self.file: Warmable | None = None
        self.warmed = 0
        self._scratch: bytearray | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._resumed.set()
        self._thread.join()

    def set_ahead(self, ahead_bytes: int) -> None:
        """Warm this far ahead from now on; 0 pauses the thread (it waits, without polling,
        until warming is asked for again)."""
        self.ahead_bytes = ahead_bytes
        if ahead_bytes:
            self._resumed.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.ahead_bytes:
                self._resumed.wait()
                self._resumed.clear()
                continue
            try:
                if not self._step():
                    self._stop.wait(self._idle_s)
            except Exception:  # warming is an optimisation; it must never take the store down
                log.exception("CommitLog page warming failed; writes continue unwarmed")
                self._stop.wait(1.0)

    def _step(self) -> bool:
        """Warm one chunk; False when there was nothing to do."""
        f = self._current()
        if f is None:
            return False
        if f is not self.file:
            self.file, self.warmed = f, 0
        start = next_warm_range(f.wrote, self.warmed, f.size, self.ahead_bytes, self.chunk_bytes)
        if start < 0:
            return False
        if self._scratch is None and not pages.POPULATE.supported:
            self._scratch = bytearray(self.chunk_bytes)  # the fallback reads into it
        if not f.warm(start, self.chunk_bytes, self._scratch):
            return False  # the file was closed under us; the next look finds its successor
        self.warmed = start + self.chunk_bytes
        return True
