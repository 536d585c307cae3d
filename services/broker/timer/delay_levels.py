"""When a send asks for its message to be delivered: at an absolute time, after a delay, or after
one of RocketMQ 4's delay levels. Pure: the caller passes the broker's clock."""

from __future__ import annotations

from typing import Final

_S: Final = 1000
_M: Final = 60 * _S
_H: Final = 60 * _M

# RocketMQ's default messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h
# 2h": level n is DELAY_LEVELS_MS[n - 1].
DELAY_LEVELS_MS: Final[tuple[int, ...]] = (
    *(s * _S for s in (1, 5, 10, 30)),
    *(m * _M for m in range(1, 11)),
    20 * _M,
    30 * _M,
    1 * _H,
    2 * _H,
)
MAX_DELAY_LEVEL: Final = len(DELAY_LEVELS_MS)


class DelayTooLongError(ValueError):
    """The delivery time lies further ahead than the broker's ``max_delay_ms``."""

    def __init__(self, due_ms: int, now_ms: int, max_delay_ms: int) -> None:
        super().__init__(
            f"delivery time {due_ms} is {due_ms - now_ms} ms ahead; this broker keeps messages "
            f"at most {max_delay_ms} ms (max_delay_ms)"
        )
        self.due_ms = due_ms
        self.max_delay_ms = max_delay_ms


def level_ms(level: int) -> int:
    """The delay of a level, 1..18."""
    if not 1 <= level <= MAX_DELAY_LEVEL:
        raise ValueError(f"delay_level {level} is not in 1..{MAX_DELAY_LEVEL}")
    return DELAY_LEVELS_MS[level - 1]


def due_ms(
    now_ms: int, deliver_at_ms: int, delay_ms: int, delay_level: int, max_delay_ms: int
) -> int | None:
    """When a message with these send options is due, or None when it is not delayed (all three
    0, as the wire leaves unset fields). At most one may be set (ValueError), none negative. A
    time already past is ``now_ms``; one beyond ``now_ms + max_delay_ms`` raises
    ``DelayTooLongError``."""
    given = [n for n, v in (("deliver_at_ms", deliver_at_ms), ("delay_ms", delay_ms)) if v]
    if delay_level:
        given.append("delay_level")
    if len(given) > 1:
        raise ValueError(f"at most one of deliver_at_ms, delay_ms, delay_level; got {given}")
    if deliver_at_ms < 0 or delay_ms < 0:
        raise ValueError("deliver_at_ms and delay_ms must not be negative")
    if deliver_at_ms:
        due = deliver_at_ms
    elif delay_ms:
        due = now_ms + delay_ms
    elif delay_level:
        due = now_ms + level_ms(delay_level)
    else:
        return None
    if due - now_ms > max_delay_ms:
        raise DelayTooLongError(due, now_ms, max_delay_ms)
    return max(due, now_ms)
