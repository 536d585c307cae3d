"""The server side's clock, in milliseconds: wall time for what is stored or shown (store
timestamps, registrations, commit times, file names), monotonic time for deadlines, intervals and
leases, which a wall-clock jump must not stretch or cut short.

It lives in the store, the bottom layer, so that replication and the services read the same one
(the SDK keeps its own in ``tidemq._runtime``: the layers share no code).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds of a clock that never goes back; only differences mean anything."""
    return time.monotonic_ns() // 1_000_000
