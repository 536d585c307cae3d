"""Page-cache warming ahead of the CommitLog's write position (RocketMQ's warmMappedFile, done
differently).

On this kind of machine the first write to a page of a fresh, preallocated file costs far more
than the copy itself: the kernel allocates a page-cache page for it (and the hypervisor backs
that memory) inside the write, with the writer waiting for it. Measured on 1 KiB records:
about 0.5-2.5 us per record cold against 0.2 us once the page is in the cache; it was the
largest single cost of a put.

A ``PageWarmer`` thread keeps the range just ahead of the writer in the page cache by reading it
with ``os.preadv`` into a scratch buffer. A read of an unwritten extent allocates zeroed cache
pages without dirtying them, so, unlike RocketMQ's zero writes or ``MADV_POPULATE_WRITE``, it adds
no disk writes; and ``preadv`` releases the GIL, so the work runs on another core while the
writer keeps going. ``POSIX_FADV_WILLNEED`` is not enough: it populates only a readahead window
of a few MiB. The pages stay clean, so memory pressure may reclaim them, which only brings the
slow faults back.

Chunks are 4 MiB: between two reads the thread waits for the GIL, up to the interpreter's 5 ms
switch interval while a writer runs, so small chunks would cap warming below the write rate.

``next_warm_range`` is the decision alone, without files or threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Warmable(Protocol):
    size: int
    wrote: int

    def warm(self, pos: int, buf: bytearray) -> bool: ...


def next_warm_range(wrote: int, warmed: int, size: int, ahead_bytes: int, chunk_bytes: int) -> int:
    """Where to read next so that [wrote, wrote + ahead_bytes) of a ``size``-byte file is warm,
    given that [.., warmed) already is; -1 when nothing needs reading.

    Reads start on chunk boundaries, and a writer that overtook the warmer (a burst) moves the
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
        self._thread = threading.Thread(target=self._run, name="commitlog-warm", daemon=True)
        # What is warm: (the file, the end of its warm range). Read by tests and stats.
        self.file: Warmable | None = None
        self.warmed = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        buf = bytearray(self.chunk_bytes)
        while not self._stop.is_set():
            try:
                if not self._step(buf):
                    self._stop.wait(self._idle_s)
            except Exception:  # warming is an optimisation; it must never take the store down
                log.exception("CommitLog page warming failed; writes continue unwarmed")
                self._stop.wait(1.0)

    def _step(self, buf: bytearray) -> bool:
        """Warm one chunk; False when there was nothing to do."""
        f = self._current()
        if f is None:
            return False
        if f is not self.file:
            self.file, self.warmed = f, 0
        start = next_warm_range(f.wrote, self.warmed, f.size, self.ahead_bytes, self.chunk_bytes)
        if start < 0:
            return False
        if not f.warm(start, buf):
            return False  # the file was closed under us; the next look finds its successor
        self.warmed = start + self.chunk_bytes
        return True
