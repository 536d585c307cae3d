"""Transaction ids: the half message's CommitLog offset (the same on every replica of the group),
with the broker group's name and a CRC so that a mistyped or altered id is refused rather than
taken for another transaction."""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

_VERSION = 1
_FIXED = struct.Struct(">BqH")  # version, half offset, length of the broker name
_CRC = struct.Struct(">I")
MAX_ID_CHARS = 256


class InvalidTransactionId(ValueError):
    """Not a transaction id this broker issued (damaged, altered, or another version)."""


@dataclass(frozen=True)
class TransactionId:
    broker_name: str
    half_offset: int

    def encode(self) -> str:
        name = self.broker_name.encode()
        raw = _FIXED.pack(_VERSION, self.half_offset, len(name)) + name
        raw += _CRC.pack(zlib.crc32(raw))
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        if not text or len(text) > MAX_ID_CHARS:
            raise InvalidTransactionId("a transaction id is 1..256 characters")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise InvalidTransactionId(f"{text!r} is not a transaction id") from None
        if len(raw) < _FIXED.size + _CRC.size:
            raise InvalidTransactionId(f"{text!r} is too short for a transaction id")
        body, (crc,) = raw[: -_CRC.size], _CRC.unpack(raw[-_CRC.size :])
        if zlib.crc32(body) != crc:
            raise InvalidTransactionId(f"{text!r} fails its check (damaged or altered)")
        version, offset, n = _FIXED.unpack_from(body)
        if version != _VERSION:
            raise InvalidTransactionId(f"transaction id version {version} is not known")
        name = body[_FIXED.size :]
        if len(name) != n or offset < 0:
            raise InvalidTransactionId(f"{text!r} is malformed")
        try:
            return cls(name.decode(), offset)
        except UnicodeDecodeError:
            raise InvalidTransactionId(f"{text!r} is malformed") from None
