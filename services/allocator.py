"""Keeping freed memory for reuse: glibc's malloc, tuned for a broker's large, short-lived
buffers.

A pull's answer, a send's request and gRPC's copies of them are megabytes each and live for one
call. With glibc's defaults each such buffer is a fresh ``mmap`` (or the heap is trimmed back to
the kernel when it is freed), so every call pays the kernel for zeroed pages again: measured on
a 2-core machine, copying a 4 MiB answer took 2-3 ms instead of 0.4 ms, and a gRPC handler
returning one held the event loop for 6.5 ms instead of 2.2 ms, time every other client's call
waited. Raising the mmap threshold and the trim threshold keeps up to ``retain_bytes`` of freed
memory in the process, where the next call's buffers reuse it. These are the settings perfkit's
guide measures its ceilings with, and the container image sets them for every process
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``); an operator's own values in those
variables win over these.

Only glibc has these knobs (``mallopt``); elsewhere this changes nothing and says so.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap: answers, requests and replication chunks of a few
# MiB. Larger ones (a request near max_request_bytes) are rare enough to be mapped on their own.
MMAP_THRESHOLD_BYTES = 8 << 20


def retain_freed_memory(retain_bytes: int) -> bool:
    """Keeps up to ``retain_bytes`` of freed memory for reuse and serves blocks up to 8 MiB from
    the heap; True when the allocator took the settings. ``retain_bytes`` 0 leaves the
    allocator's defaults, and a setting given in the environment is left as it is."""
    if retain_bytes < 0:
        raise ValueError(f"retain_bytes must be >= 0, got {retain_bytes}")
    if retain_bytes == 0:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        log.info("the C library has no mallopt (not glibc): allocator settings left as they are")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt takes an int: the trim threshold is capped at 2 GiB - 1.
    wanted = (
        ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, min(retain_bytes, (1 << 31) - 1)),
    )
    took = True
    for variable, param, value in wanted:
        if variable not in os.environ:
            took = bool(mallopt(param, value)) and took
    if not took:
        log.warning("the C library refused the allocator settings (mallopt failed)")
    return took
