"""Receipt handles: the opaque text a receiver gets per message and gives back to ack it.

A handle names the message (broker group, consumer group, topic, queue, offset) and the lease
that delivered it (``lease_id``, the CommitLog offset of the event record that granted it), so
the broker can tell a current handle from an expired, superseded or already acked one without
any per-handle state. It is not a secret: the CRC catches damage, not forgery, and a client
of the group that guesses a current lease id could settle a message it was not given (as with
RocketMQ's handles); a stale or made-up lease is refused.

Byte format (version 2), then URL-safe base64 without padding::

    version   u8 = 2
    names_len u16 BE                     (bytes of the names block; 3 + names_len is a
                                          multiple of 3)
    names     broker, group, topic: each u16 BE length + UTF-8, then zero bytes up to names_len
    queue_id  i32 BE                     (>= 0)
    offset    i64 BE                     (>= 0, ConsumeQueue offset)
    lease_id  i64 BE                     (>= 0)
    until_ms  i64 BE                     (>= 0, invisible until, wall clock)
    crc32     u32 BE                     (zlib.crc32 of every byte before it)

The names block ends on a 3-byte boundary, so its base64 text is a prefix of the handle's text
that every handle of one call shares: the broker encodes it once per call (``HandleWriter``)
and on ack compares it as text and decodes only the 32 bytes of numbers (``HandleReader``).

Version 1 (still read: handles issued before an upgrade stay good) has no names_len and no
padding: version, the three names, the numbers, the CRC.

Decoding refuses anything else (``InvalidHandle``): text over 1 KiB, bad base64, another
version, a CRC mismatch, lengths that do not add up, padding that is not zeros, trailing
bytes, negatives.
"""

from __future__ import annotations

import binascii
import struct
import zlib
from dataclasses import dataclass

VERSION = 2
_VERSION_1 = 1
MAX_TEXT_CHARS = 1024
_U16 = struct.Struct(">H")
_HEAD = struct.Struct(">BH")  # version, names_len
_NUMBERS = struct.Struct(">iqqq")
_CRC = struct.Struct(">I")
_TAIL = struct.Struct(">iqqqI")  # the numbers and the CRC: 32 bytes
_TAIL_CHARS = 43  # 32 bytes in base64 without padding
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_URLSAFE_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class InvalidHandle(ValueError):
    """The text is not a receipt handle this broker issued (in any version it knows)."""


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URLSAFE).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        data = text.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidHandle("receipt handle is not base64: not ASCII") from None
    if not _URLSAFE_CHARS.issuperset(data):
        raise InvalidHandle("receipt handle is not base64: a character outside its alphabet")
    if len(data) % 4 == 1:
        raise InvalidHandle("receipt handle is not base64: its length")
    padded = data.translate(_FROM_URLSAFE) + b"=" * (-len(data) % 4)
    try:
        return binascii.a2b_base64(padded, strict_mode=True)
    except binascii.Error as e:
        raise InvalidHandle(f"receipt handle is not base64: {e}") from None


def _names_block(broker_name: str, group: str, topic: str) -> bytes:
    """Version, names_len and the names, padded to a multiple of 3 bytes."""
    names = b"".join(
        _U16.pack(len(raw)) + raw for raw in map(str.encode, (broker_name, group, topic))
    )
    names += b"\0" * (-(_HEAD.size + len(names)) % 3)
    return _HEAD.pack(VERSION, len(names)) + names


class HandleWriter:
    """Encodes the handles of one call: the names once, the numbers per message."""

    __slots__ = ("_crc", "_text", "text_size")

    def __init__(self, broker_name: str, group: str, topic: str) -> None:
        head = _names_block(broker_name, group, topic)
        self._text = _b64(head)
        self._crc = zlib.crc32(head)
        self.text_size = len(self._text) + _TAIL_CHARS  # of every handle it encodes
        if self.text_size > MAX_TEXT_CHARS:
            raise ValueError(f"receipt handle over {MAX_TEXT_CHARS} characters (names too long)")

    def encode(self, queue_id: int, offset: int, lease_id: int, invisible_until_ms: int) -> str:
        if queue_id < 0 or offset < 0 or lease_id < 0 or invisible_until_ms < 0:
            raise ValueError(
                "receipt handle fields must be >= 0, got queue_id, offset, lease_id, "
                f"invisible_until_ms = {queue_id}, {offset}, {lease_id}, {invisible_until_ms}"
            )
        numbers = _NUMBERS.pack(queue_id, offset, lease_id, invisible_until_ms)
        tail = numbers + _CRC.pack(zlib.crc32(numbers, self._crc))
        return self._text + _b64(tail)


class HandleReader:
    """Reads the handles a call names for its broker group, group and topic: a handle whose
    text starts with theirs has only its numbers decoded. ``numbers`` answers None for any
    other text (another version, other names, damage): ``ReceiptHandle.decode`` says why."""

    __slots__ = ("_crc", "_size", "_text")

    def __init__(self, broker_name: str, group: str, topic: str) -> None:
        head = _names_block(broker_name, group, topic)
        self._text = _b64(head)
        self._crc = zlib.crc32(head)
        self._size = len(self._text) + _TAIL_CHARS

    def numbers(self, text: str) -> tuple[int, int, int, int] | None:
        """(queue_id, offset, lease_id, invisible_until_ms) of a good handle of these names."""
        if len(text) != self._size or not text.startswith(self._text):
            return None
        try:
            tail = binascii.a2b_base64(
                text[-_TAIL_CHARS:].encode("ascii").translate(_FROM_URLSAFE) + b"=",
                strict_mode=True,
            )
        except (UnicodeEncodeError, binascii.Error):
            return None
        queue_id, offset, lease_id, until, crc = _TAIL.unpack(tail)
        if zlib.crc32(tail[:-4], self._crc) != crc:
            return None
        if queue_id < 0 or offset < 0 or lease_id < 0 or until < 0:
            return None
        return queue_id, offset, lease_id, until


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
        return HandleWriter(self.broker_name, self.group, self.topic).encode(
            self.queue_id, self.offset, self.lease_id, self.invisible_until_ms
        )

    @staticmethod
    def decode(text: str) -> ReceiptHandle:
        if not isinstance(text, str) or not text:
            raise InvalidHandle("empty receipt handle")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidHandle(f"receipt handle over {MAX_TEXT_CHARS} characters")
        raw = _unb64(text)
        if len(raw) < 1 + 3 * _U16.size + _TAIL.size:
            raise InvalidHandle("receipt handle too short")
        version = raw[0]
        if version not in (VERSION, _VERSION_1):
            raise InvalidHandle(f"receipt handle version {version} unknown")
        body, (crc,) = raw[:-4], _CRC.unpack(raw[-4:])
        if zlib.crc32(body) != crc:
            raise InvalidHandle("receipt handle CRC mismatch")
        if version == VERSION:
            (names_len,) = _U16.unpack_from(body, 1)
            end = _HEAD.size + names_len
            if end % 3 or len(body) - end != _NUMBERS.size:
                raise InvalidHandle("receipt handle length mismatch")
            names, pos = _names(body, _HEAD.size, end)
            if any(body[pos:end]):
                raise InvalidHandle("receipt handle names padding is not zeros")
        else:
            names, pos = _names(body, 1, len(body))
            if len(body) - pos != _NUMBERS.size:
                raise InvalidHandle("receipt handle length mismatch")
        queue_id, offset, lease_id, until = _NUMBERS.unpack_from(body, len(body) - _NUMBERS.size)
        if min(queue_id, offset, lease_id, until) < 0:
            raise InvalidHandle("receipt handle with a negative field")
        return ReceiptHandle(names[0], names[1], names[2], queue_id, offset, lease_id, until)


def _names(body: bytes, pos: int, end: int) -> tuple[list[str], int]:
    """The three names from ``pos``, within ``end``; and where they end."""
    names: list[str] = []
    for _ in range(3):
        if pos + 2 > end:
            raise InvalidHandle("receipt handle truncated")
        (n,) = _U16.unpack_from(body, pos)
        pos += 2
        if pos + n > end:
            raise InvalidHandle("receipt handle name length out of range")
        try:
            names.append(body[pos : pos + n].decode())
        except UnicodeDecodeError:
            raise InvalidHandle("receipt handle name is not UTF-8") from None
        pos += n
    return names, pos
