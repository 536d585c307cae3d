"""When the push consumer renews a running message's invisibility (no I/O, no clock: times
are the consumer's monotonic ms, passed in).

A message is held until ``deadline_ms``: the time its receive (or last renewal) was sent plus
the invisible duration, which is never later than the broker's own deadline. While its listener
runs, the hold is renewed a third of the duration before it ends, so one slow call or a short
pause of the process does not lose it; after ``consume_timeout_ms`` of running it is no longer
renewed (RocketMQ's consumeTimeout) and the message goes back to the group when its
invisibility ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Renewal(enum.Enum):
    WAIT = "wait"  # nothing to do yet
    RENEW = "renew"  # extend the invisibility now
    GIVE_UP = "give_up"  # ran longer than consume_timeout_ms: let the hold end


@dataclass
class Hold:
    """One running message's hold on its delivery."""

    started_ms: int
    deadline_ms: int
    renewing: bool = False  # a renewal is in flight
    released: bool = False  # given up or lost: never renewed again


def decide(hold: Hold, now_ms: int, duration_ms: int, consume_timeout_ms: int) -> Renewal:
    if hold.released or hold.renewing:
        return Renewal.WAIT
    if now_ms - hold.started_ms >= consume_timeout_ms:
        return Renewal.GIVE_UP
    if hold.deadline_ms - now_ms <= duration_ms // 3:
        return Renewal.RENEW
    return Renewal.WAIT


def check_interval_ms(duration_ms: int) -> int:
    """How often holds are looked at: often enough to renew each inside its last third."""
    return max(50, min(1_000, duration_ms // 6))
