"""Page operations on a whole range in one native call each, never a Python loop over pages:
faulting a range in ahead of need (``madvise`` with ``MADV_POPULATE_READ`` / ``_WRITE``, Linux
5.14), locking it in memory (``mlock``) and unlocking it.

They are called through ctypes on libc, which releases the GIL for the length of the call:
CPython's ``mmap.madvise`` holds it, so a populate of a few MiB through it would stop every other
thread of the store for milliseconds. Every function answers the call's errno (0: done) rather
than raising: warming and locking are optimisations, and a refusal (an old kernel, a low
``RLIMIT_MEMLOCK``) is counted and logged once by the caller (``PageCounters``), never fatal.

The range must stay mapped for the length of the call. The callers (``MappedFile``, the transient
store pool) hold the lock that their ``close`` takes before unmapping, so a mapping can never be
unmapped, or its address reused, under a call in flight.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MADV_WILLNEED = 3
MADV_POPULATE_READ = 22  # Linux 5.14: fault the range in (readable), as reads would
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault the range in writable, as writes would

_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int
_mlock = _libc.mlock
_mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_mlock.restype = ctypes.c_int
_munlock = _libc.munlock
_munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_munlock.restype = ctypes.c_int


def address_of(mm: mmap.mmap) -> int:
    """Where a writable mapping starts. The buffer export that finds it ends before this
    returns, so it never stands in the way of ``mm.close()``."""
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def _call(fn: Callable[..., int], *args: int) -> int:
    ctypes.set_errno(0)
    if fn(*args) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


def madvise(addr: int, length: int, advice: int) -> int:
    return _call(_madvise, addr, length, advice)


def mlock(addr: int, length: int) -> int:
    return _call(_mlock, addr, length)


def munlock(addr: int, length: int) -> int:
    return _call(_munlock, addr, length)


class _Populate:
    """Whether this kernel has ``MADV_POPULATE_*``: learnt from the first refusal (EINVAL on
    kernels before 5.14), after which callers use their fallback without asking again."""

    supported = True


POPULATE = _Populate()


def populate(addr: int, length: int, *, write: bool) -> int:
    """Fault [addr, addr + length) in with one call: 0 when done, EINVAL when the kernel lacks
    ``MADV_POPULATE_*`` (``POPULATE.supported`` then turns False), another errno otherwise."""
    if not POPULATE.supported:
        return errno.EINVAL
    err = madvise(addr, length, MADV_POPULATE_WRITE if write else MADV_POPULATE_READ)
    if err == errno.EINVAL:
        POPULATE.supported = False
        log.info(
            "madvise(MADV_POPULATE_*) refused (a kernel before 5.14): page warming falls back "
            "to MADV_WILLNEED and reads"
        )
    return err


@dataclass(frozen=True)
class PageStats:
    """What the store's page settings did (``MessageStore.page_stats``).

    ``warming``: how pages are brought in ahead of the writer ("madvise", "preadv" where the
    kernel lacks MADV_POPULATE_*). ``mlock_failures``: mlock calls refused (a file being written
    with ``mlock_commitlog``, a pool buffer), ``mlock_error`` the first refusal's reason. The
    ``pool_*`` figures are the transient store pool's (all 0 without one): buffers made, free
    now, files that found none free (written directly instead), and ``commits``, the commits
    that moved the CommitLog's committed position."""

    warming: str
    mlock_failures: int
    mlock_error: str | None
    pool_buffers: int
    pool_free: int
    pool_misses: int
    commits: int


class PageCounters:
    """Refusals of page operations: counted, and logged once per store, not once per file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.mlock_failures = 0
        self.mlock_error: str | None = None

    def mlock_failed(self, what: str, err: int) -> None:
        with self._lock:
            self.mlock_failures += 1
            first = self.mlock_error is None
            if first:
                self.mlock_error = f"{what}: {errno.errorcode.get(err, err)} ({os.strerror(err)})"
        if first:
            log.warning(
                "mlock of %s refused: %s; the pages stay unlocked (raise RLIMIT_MEMLOCK, "
                "`ulimit -l`, or grant CAP_IPC_LOCK). Later refusals are only counted",
                what,
                os.strerror(err),
            )
