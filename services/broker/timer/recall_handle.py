"""The recall handle a delayed send answers with: which broker group holds the timer and which
timer it is, as text a client keeps and hands back to recall the message before it is due.

Bytes (version 1), then URL-safe base64 without padding::

    version u8 (=1) | broker_name (u16 BE length + UTF-8) | topic (u16 BE length + UTF-8)
    | timer_id u64 BE | deliver_at_ms u64 BE | CRC-32 (zlib) of everything before, u32 BE

``timer_id`` is the CommitLog offset of the delayed message's first ``%SYS%TIMER`` record, the
same on every replica of the group, so a handle stays valid across failover. The CRC catches a
handle damaged in transit or pasted wrong; it is no signature: the broker still checks the
timer is pending with that delivery time and topic before it recalls anything.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass
from typing import Final

VERSION: Final = 1
MAX_HANDLE_CHARS: Final = 512
_U16 = struct.Struct(">H")
_TAIL = struct.Struct(">QQ")
_CRC = struct.Struct(">I")


class InvalidRecallHandle(ValueError):
    """The text is not a recall handle this broker can read."""


@dataclass(frozen=True, slots=True)
class RecallHandle:
    broker_name: str
    topic: str
    timer_id: int
    deliver_at_ms: int

    def encode(self) -> str:
        out = bytearray((VERSION,))
        for s in (self.broker_name, self.topic):
            raw = s.encode()
            if len(raw) > 0xFFFF:
                raise ValueError("name over 65535 bytes")
            out += _U16.pack(len(raw)) + raw
        if not (0 <= self.timer_id < 1 << 64 and 0 <= self.deliver_at_ms < 1 << 64):
            raise ValueError("timer_id and deliver_at_ms must be in [0, 2^64)")
        out += _TAIL.pack(self.timer_id, self.deliver_at_ms)
        out += _CRC.pack(zlib.crc32(out))
        text = base64.urlsafe_b64encode(bytes(out)).rstrip(b"=").decode("ascii")
        if len(text) > MAX_HANDLE_CHARS:
            raise ValueError(f"recall handle over {MAX_HANDLE_CHARS} characters")
        return text

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        if not text or len(text) > MAX_HANDLE_CHARS:
            raise InvalidRecallHandle(f"a recall handle is 1..{MAX_HANDLE_CHARS} characters")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise InvalidRecallHandle("recall handle is not URL-safe base64") from None
        if len(raw) < 1 + 2 + 2 + _TAIL.size + _CRC.size:
            raise InvalidRecallHandle("recall handle truncated")
        body, (crc,) = raw[: -_CRC.size], _CRC.unpack_from(raw, len(raw) - _CRC.size)
        if zlib.crc32(body) != crc:
            raise InvalidRecallHandle("recall handle damaged (checksum mismatch)")
        if body[0] != VERSION:
            raise InvalidRecallHandle(f"recall handle version {body[0]} is not supported")
        pos = 1
        names: list[str] = []
        for _ in range(2):
            if pos + 2 > len(body):
                raise InvalidRecallHandle("recall handle truncated")
            (n,) = _U16.unpack_from(body, pos)
            pos += 2
            try:
                names.append(body[pos : pos + n].decode())
            except UnicodeDecodeError:
                raise InvalidRecallHandle("recall handle name is not UTF-8") from None
            pos += n
        if pos + _TAIL.size != len(body):
            raise InvalidRecallHandle("recall handle has the wrong length")
        timer_id, deliver_at_ms = _TAIL.unpack_from(body, pos)
        return cls(names[0], names[1], timer_id, deliver_at_ms)
