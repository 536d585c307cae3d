"""The records of ``%SYS%TRANS_OP`` queue 0: a half message resolved (committed or rolled back,
by its producer or by the checker) and a check sent about it. A versioned binary codec: the
bytes are replicated and replayed by brokers of other versions, so they are pinned by golden
tests."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

OP_TOPIC = "%SYS%TRANS_OP"
HALF_TOPIC = "%SYS%TRANS_HALF"
OP_QUEUE = 0

_VERSION = 1
_RESOLVED, _CHECKED = 1, 2
_HEAD = struct.Struct(">BB")  # version, kind
_RESOLVED_BODY = struct.Struct(">qBB")  # half offset, resolution, by check
_CHECKED_BODY = struct.Struct(">qiq")  # half offset, check number, at ms


class EventFormatError(ValueError):
    """A record that is not an event this broker can read."""


class Resolution(enum.IntEnum):
    COMMIT = 1
    ROLLBACK = 2


@dataclass(frozen=True)
class Resolved:
    half_offset: int
    resolution: Resolution
    by_check: bool


@dataclass(frozen=True)
class Checked:
    half_offset: int
    number: int
    at_ms: int


Event = Resolved | Checked


def encode_event(event: Event) -> bytes:
    if isinstance(event, Resolved):
        return _HEAD.pack(_VERSION, _RESOLVED) + _RESOLVED_BODY.pack(
            event.half_offset, int(event.resolution), int(event.by_check)
        )
    return _HEAD.pack(_VERSION, _CHECKED) + _CHECKED_BODY.pack(
        event.half_offset, event.number, event.at_ms
    )


def decode_event(data: bytes) -> Event:
    if len(data) < _HEAD.size:
        raise EventFormatError(f"a transaction op record of {len(data)} bytes")
    version, kind = _HEAD.unpack_from(data)
    if version != _VERSION:
        raise EventFormatError(f"transaction op record version {version}")
    body = data[_HEAD.size :]
    try:
        if kind == _RESOLVED and len(body) == _RESOLVED_BODY.size:
            offset, resolution, by_check = _RESOLVED_BODY.unpack(body)
            return Resolved(offset, Resolution(resolution), bool(by_check))
        if kind == _CHECKED and len(body) == _CHECKED_BODY.size:
            return Checked(*_CHECKED_BODY.unpack(body))
    except ValueError as e:
        raise EventFormatError(str(e)) from None
    raise EventFormatError(f"transaction op record of kind {kind} and {len(body)} bytes")
