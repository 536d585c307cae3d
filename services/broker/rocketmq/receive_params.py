"""The rules a v2 (``apache.rocketmq.v2``) receive follows before it reaches the broker's own
receive path: how long it long-polls, how long its messages stay invisible, how many it takes
and which filter it may carry. Pure: every input (the call's remaining deadline, the broker's
bounds) is an argument.

They follow what RocketMQ's proxy does (spec §6.1), with these differences, on purpose:

- Long poll: the requested time (or, when absent, the remaining deadline minus half the
  client's request timeout) is clamped to [5 s, 20 s] and then to the call's remaining
  deadline minus a margin, so the stream always ends before the client gives up. The proxy
  refuses with ILLEGAL_POLLING_TIME once less than 5 s of deadline is left; we poll for what
  is left and refuse only when nothing is.
- Invisible time: the broker's own bounds (``receive_min_invisible_ms`` ..
  ``receive_max_invisible_ms``, 1 s .. 12 h by default) rather than the proxy's 10 s .. 12 h,
  so a group behaves the same on both protocols. A change of invisible time below the floor
  is raised to it (a push consumer's nack asks for its backoff, which may be shorter).
"""

from __future__ import annotations

from typing import Any

from tidemq.protos.rocketmq import definition_pb2
from tidemq.services.broker.rocketmq.status import StatusError

MIN_LONG_POLL_MS = 5_000
MAX_LONG_POLL_MS = 20_000
# Kept between the poll's end and the client's deadline: time to answer and to travel.
DEADLINE_MARGIN_MS = 1_000
# The official clients' request timeout when the client never told us its own.
DEFAULT_REQUEST_TIMEOUT_MS = 3_000
MAX_BATCH_SIZE = 32
# A push consumer's receive (auto_renew): the broker renews the invisibility itself.
AUTO_RENEW_INVISIBLE_MS = 60_000

Code = definition_pb2.Code


def duration_ms(d: Any) -> int:
    """A google.protobuf.Duration in milliseconds (truncated)."""
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def long_poll_ms(
    requested_ms: int | None, remaining_ms: int | None, request_timeout_ms: int | None
) -> int:
    """How long the receive may wait for messages. ``remaining_ms``: the call's deadline
    (None: the client set none); ``request_timeout_ms``: the client's, from its settings."""
    if requested_ms is None:
        if remaining_ms is None:
            requested_ms = MAX_LONG_POLL_MS
        else:
            timeout = request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS
            requested_ms = max(0, remaining_ms - timeout // 2)
    if requested_ms < 0:
        raise StatusError(Code.ILLEGAL_POLLING_TIME, f"long_polling_timeout {requested_ms} ms < 0")
    poll = min(max(requested_ms, MIN_LONG_POLL_MS), MAX_LONG_POLL_MS)
    if remaining_ms is None:
        return poll
    budget = remaining_ms - DEADLINE_MARGIN_MS
    if budget <= 0:
        raise StatusError(
            Code.ILLEGAL_POLLING_TIME,
            f"the call's deadline leaves {remaining_ms} ms, too little to poll (keep the "
            f"request timeout above {DEADLINE_MARGIN_MS} ms)",
        )
    return min(poll, budget)


def batch_size(n: int) -> int:
    if n <= 0:
        raise StatusError(Code.BAD_REQUEST, f"batch_size must be > 0, got {n}")
    return min(n, MAX_BATCH_SIZE)


def receive_invisible_ms(requested_ms: int | None, auto_renew: bool, lo_ms: int, hi_ms: int) -> int:
    """The invisible time of a receive's messages, within the broker's [lo_ms, hi_ms]."""
    if auto_renew:
        return min(max(AUTO_RENEW_INVISIBLE_MS, lo_ms), hi_ms)
    if requested_ms is None:
        raise StatusError(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
    if not lo_ms <= requested_ms <= hi_ms:
        raise StatusError(
            Code.ILLEGAL_INVISIBLE_TIME,
            f"invisible_duration must be {lo_ms}..{hi_ms} ms, got {requested_ms} ms",
        )
    return requested_ms


def change_invisible_ms(requested_ms: int, lo_ms: int, hi_ms: int) -> int:
    """A ChangeInvisibleDuration's new invisible time: at most hi_ms; below lo_ms it is raised
    to lo_ms (the message comes back a little later than asked, never earlier)."""
    if requested_ms < 0 or requested_ms > hi_ms:
        raise StatusError(
            Code.ILLEGAL_INVISIBLE_TIME,
            f"invisible_duration must be 0..{hi_ms} ms, got {requested_ms} ms",
        )
    return max(requested_ms, lo_ms)


def tag_expression(filter_expression: Any, has_filter: bool) -> str:
    """The broker's tag expression for a v2 FilterExpression (none: everything)."""
    if not has_filter:
        return "*"
    kind = filter_expression.type
    if kind == definition_pb2.SQL:
        raise StatusError(
            Code.ILLEGAL_FILTER_EXPRESSION,
            "SQL92 filter expressions are not supported by tidemq; subscribe with a TAG "
            'expression ("*" or "tagA || tagB")',
        )
    if kind not in (definition_pb2.TAG, definition_pb2.FILTER_TYPE_UNSPECIFIED):
        raise StatusError(Code.ILLEGAL_FILTER_EXPRESSION, f"unknown filter type {kind}")
    return filter_expression.expression or "*"


def is_own_broker(named: str, own: str) -> bool:
    """A receive names the broker group it pops from; an empty name means this one."""
    return not named or named == own


def ack_status_code(codes: list[int]) -> int:
    """The top-level code of a batch answer: the entries' common code (OK normally), else
    MULTIPLE_RESULTS."""
    distinct = set(codes)
    if len(distinct) == 1:
        return distinct.pop()
    return int(Code.MULTIPLE_RESULTS if distinct else Code.OK)
