"""The events of the timer log and their byte format.

The master appends one event per record body to ``%SYS%TIMER_LOG`` (queue 0); slaves replicate
the records and build the same ``TimerProgress`` from them. A delayed message itself is a
``%SYS%TIMER`` record (queue 0) whose ConsumeQueue entry carries its delivery time
(``tidemq.storage.record.TIMER_TOPIC``); its ``timer_id`` is that record's CommitLog offset and
its ``seq`` its queue offset.

Byte format (version 1), integers unsigned 64-bit big-endian::

    record   := version u8 (=1) | kind u8 | body
    Fired    (kind 1) := up_to_ms u64 | low_seq u64
    Recalled (kind 2) := timer_id u64 | deliver_at_ms u64

Unknown versions or kinds, truncation and trailing bytes raise ``TimerEventFormatError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from tidemq.storage.record import TIMER_TOPIC

TIMER_LOG_TOPIC: Final = "%SYS%TIMER_LOG"
__all__ = [
    "TIMER_LOG_TOPIC",
    "TIMER_TOPIC",
    "Fired",
    "Recalled",
    "TimerEvent",
    "TimerEventFormatError",
    "decode_timer_event",
    "encode_timer_event",
]

VERSION: Final = 1
KIND_FIRED: Final = 1
KIND_RECALLED: Final = 2
_HEAD = struct.Struct(">BB")
_PAIR = struct.Struct(">QQ")
_SIZE: Final = _HEAD.size + _PAIR.size


class TimerEventFormatError(ValueError):
    """The bytes are not a timer event of a version this broker knows."""


@dataclass(frozen=True, slots=True)
class Fired:
    """Every timer record due at or before ``up_to_ms`` is delivered (or recalled), and every
    ``%SYS%TIMER`` queue offset below ``low_seq`` is delivered or recalled. The master appends
    it in the same put as the real messages it delivered, after them. A batch that stopped
    within one millisecond (``max_entries``) marks the millisecond before it."""

    up_to_ms: int
    low_seq: int


@dataclass(frozen=True, slots=True)
class Recalled:
    """The timer whose first record is at CommitLog offset ``timer_id`` will not be delivered."""

    timer_id: int
    deliver_at_ms: int


TimerEvent = Fired | Recalled


def encode_timer_event(ev: TimerEvent) -> bytes:
    if isinstance(ev, Fired):
        kind, a, b = KIND_FIRED, ev.up_to_ms, ev.low_seq
    else:
        kind, a, b = KIND_RECALLED, ev.timer_id, ev.deliver_at_ms
    if not (0 <= a < 1 << 64 and 0 <= b < 1 << 64):
        raise ValueError(f"{ev!r}: fields must be in [0, 2^64)")
    return _HEAD.pack(VERSION, kind) + _PAIR.pack(a, b)


def decode_timer_event(data: bytes) -> TimerEvent:
    if len(data) < _HEAD.size:
        raise TimerEventFormatError("timer event truncated")
    version, kind = _HEAD.unpack_from(data)
    if version != VERSION:
        raise TimerEventFormatError(f"timer event version {version} is not supported")
    if kind not in (KIND_FIRED, KIND_RECALLED):
        raise TimerEventFormatError(f"unknown timer event kind {kind}")
    if len(data) != _SIZE:
        raise TimerEventFormatError(f"timer event is {len(data)} bytes, {_SIZE} expected")
    a, b = _PAIR.unpack_from(data, _HEAD.size)
    return Fired(a, b) if kind == KIND_FIRED else Recalled(a, b)
