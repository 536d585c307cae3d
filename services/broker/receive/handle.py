"""Receipt handles: the opaque text a receiver gets per message and gives back to ack it.

A handle names the message (broker group, consumer group, topic, queue, offset) and the lease
that delivered it (``lease_id``, the CommitLog offset of the event record that granted it), so
the broker can tell a current handle from an expired, superseded or already acked one without
any per-handle state. It is not a secret: the CRC catches damage, not forgery, and a client
of the group that guesses a current lease id could settle a message it was not given (as with
RocketMQ's handles); a stale or made-up lease is refused.

Byte format (version 1), then URL-safe base64 without padding::

    version   u8 = 1
    broker    u16 BE length + UTF-8      (broker group name)
    group     u16 BE length + UTF-8
    topic     u16 BE length + UTF-8
    queue_id  i32 BE                     (>= 0)
    offset    i64 BE                     (>= 0, ConsumeQueue offset)
    lease_id  i64 BE                     (>= 0)
    until_ms  i64 BE                     (>= 0, invisible until, wall clock)
    crc32     u32 BE                     (zlib.crc32 of every byte before it)

Decoding refuses anything else (``InvalidHandle``): text over 1 KiB, bad base64, another
version, a CRC mismatch, lengths that do not add up, trailing bytes, negatives.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

VERSION = 1
MAX_TEXT_CHARS = 1024
_U16 = struct.Struct(">H")
_TAIL = struct.Struct(">iqqq")
_CRC = struct.Struct(">I")


class InvalidHandle(ValueError):
    """The text is not a receipt handle this broker issued (in any version it knows)."""


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    broker_name: str
    group: str
    topic: str
    queue_id: int
    offset: int
    lease_id: int
    invisible_until_ms: int

    def encode(self) -> str:
        for name in ("queue_id", "offset", "lease_id", "invisible_until_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"receipt handle {name} must be >= 0, got {getattr(self, name)}")
        parts = [bytes((VERSION,))]
        for s in (self.broker_name, self.group, self.topic):
            raw = s.encode()
            parts.append(_U16.pack(len(raw)) + raw)
        parts.append(_TAIL.pack(self.queue_id, self.offset, self.lease_id, self.invisible_until_ms))
        body = b"".join(parts)
        text = base64.urlsafe_b64encode(body + _CRC.pack(zlib.crc32(body))).rstrip(b"=")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"receipt handle over {MAX_TEXT_CHARS} characters (names too long)")
        return text.decode("ascii")

    @staticmethod
    def decode(text: str) -> ReceiptHandle:
        if not isinstance(text, str) or not text:
            raise InvalidHandle("empty receipt handle")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidHandle(f"receipt handle over {MAX_TEXT_CHARS} characters")
        try:
            padded = text.encode("ascii") + b"=" * (-len(text) % 4)
            raw = base64.b64decode(padded, altchars=b"-_", validate=True)
        except (UnicodeEncodeError, binascii.Error) as e:
            raise InvalidHandle(f"receipt handle is not base64: {e}") from None
        if len(raw) < 1 + 3 * _U16.size + _TAIL.size + _CRC.size:
            raise InvalidHandle("receipt handle too short")
        if raw[0] != VERSION:
            raise InvalidHandle(f"receipt handle version {raw[0]} unknown")
        body, (crc,) = raw[:-4], _CRC.unpack(raw[-4:])
        if zlib.crc32(body) != crc:
            raise InvalidHandle("receipt handle CRC mismatch")
        pos = 1
        names: list[str] = []
        for _ in range(3):
            if pos + 2 > len(body):
                raise InvalidHandle("receipt handle truncated")
            (n,) = _U16.unpack_from(body, pos)
            pos += 2
            if pos + n > len(body):
                raise InvalidHandle("receipt handle name length out of range")
            try:
                names.append(body[pos : pos + n].decode())
            except UnicodeDecodeError:
                raise InvalidHandle("receipt handle name is not UTF-8") from None
            pos += n
        if len(body) - pos != _TAIL.size:
            raise InvalidHandle("receipt handle length mismatch")
        queue_id, offset, lease_id, until = _TAIL.unpack_from(body, pos)
        if min(queue_id, offset, lease_id, until) < 0:
            raise InvalidHandle("receipt handle with a negative field")
        return ReceiptHandle(names[0], names[1], names[2], queue_id, offset, lease_id, until)
