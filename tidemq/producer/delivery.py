"""When a sent message becomes visible: the ``deliver_at``, ``delay`` and ``delay_level``
options of ``send``, checked and turned into the wire's (deliver_at_ms, delay_ms, delay_level).

The broker decides the delivery time by its own clock (``delay`` counts from when it stores the
message); a time already past is delivered at once; further ahead than the broker's
``max_delay_ms`` is refused with ``DelayTooLong``.
"""

from __future__ import annotations

import datetime as dt

from tidemq.errors import InvalidArgumentError

# RocketMQ 4's delay levels: 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
MAX_DELAY_LEVEL = 18

Delivery = tuple[int, int, int]


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, code="INVALID_ARGUMENT")


def delivery(
    deliver_at: dt.datetime | int | None,
    delay: dt.timedelta | float | None,
    delay_level: int | None,
) -> Delivery | None:
    """The wire's (deliver_at_ms, delay_ms, delay_level), or None for a message sent now.
    ``deliver_at``: a datetime (naive means local time) or ms since the epoch; ``delay``: a
    timedelta or seconds; ``delay_level``: 1..18. At most one of them."""
    given = [x for x in (deliver_at, delay, delay_level) if x is not None]
    if not given:
        return None
    if len(given) > 1:
        raise _bad("give at most one of deliver_at, delay and delay_level")
    if deliver_at is not None:
        if isinstance(deliver_at, dt.datetime):
            ms = round(deliver_at.timestamp() * 1000)
        elif isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
            ms = deliver_at
        else:
            raise _bad("deliver_at is a datetime or ms since the epoch")
        if ms <= 0:
            raise _bad(f"deliver_at must be after the epoch, got {deliver_at!r}")
        return ms, 0, 0
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            seconds = float(delay)
        else:
            raise _bad("delay is a timedelta or seconds")
        ms = round(seconds * 1000)
        if ms < 0:
            raise _bad(f"delay must be >= 0, got {delay!r}")
        # A zero delay is a plain send.
        return (0, ms, 0) if ms else None
    assert delay_level is not None
    if isinstance(delay_level, bool) or not isinstance(delay_level, int):
        raise _bad("delay_level is an int")
    if not 1 <= delay_level <= MAX_DELAY_LEVEL:
        raise _bad(f"delay_level must be 1..{MAX_DELAY_LEVEL}, got {delay_level}")
    return 0, 0, delay_level
