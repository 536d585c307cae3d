"""Hand-written wire encodings of the messages whose ``bytes`` field carries megabytes: the
replication stream's chunks (``MasterMessage.chunk``, replication.proto).

Building such a message with protobuf copies its bytes into the message, and serializing it copies
them again (and a nested message once more); parsing one copies them out. A replication chunk is
up to 4 MiB, sent as fast as the stream goes: encoded here, its bytes are copied once, into the
frame; parsed here, they are a view of the frame, not a copy. The bytes are protobuf's own
encoding (field tags, varints, length prefixes), so either side may be protobuf instead.
"""

from __future__ import annotations

# (field number << 3) | wire type: 0 varint, 2 length-delimited.
_VARINT, _LEN = 0, 2
_CHUNK = bytes(((2 << 3) | _LEN,))  # MasterMessage.chunk
# Chunk's fields: offset, data, epoch, epoch_start_offset, confirm_offset.
_OFFSET, _DATA, _EPOCH, _EPOCH_START, _CONFIRM = 1, 2, 3, 4, 5


def varint(n: int) -> bytes:
    """A non-negative integer as protobuf writes it."""
    if n < 0:
        raise ValueError(f"{n} is negative: this encoder writes only non-negative numbers")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def chunk_frame(
    offset: int, data: bytes, epoch: int, epoch_start_offset: int, confirm_offset: int
) -> bytes:
    """``MasterMessage(chunk=Chunk(...))`` serialized, the data copied once."""
    fields = b"".join(
        (
            bytes(((_OFFSET << 3) | _VARINT,)),
            varint(offset),
            bytes(((_EPOCH << 3) | _VARINT,)),
            varint(epoch),
            bytes(((_EPOCH_START << 3) | _VARINT,)),
            varint(epoch_start_offset),
            bytes(((_CONFIRM << 3) | _VARINT,)),
            varint(confirm_offset),
            bytes(((_DATA << 3) | _LEN,)),
            varint(len(data)),
        )
    )
    return b"".join((_CHUNK, varint(len(fields) + len(data)), fields, data))


class FrameError(ValueError):
    """Bytes that are not a well-formed message."""


def _read_varint(buf: memoryview, at: int, end: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= end or shift > 63:
            raise FrameError("a varint runs past its message")
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, at
        shift += 7


def parse_chunk_frame(raw: bytes) -> tuple[int, memoryview, int, int, int] | None:
    """A serialized ``MasterMessage`` holding a chunk as (offset, data, epoch,
    epoch_start_offset, confirm_offset), the data a view of ``raw``; None for any other
    ``MasterMessage`` (protobuf parses those). Raises ``FrameError`` for malformed bytes."""
    buf = memoryview(raw)
    n = len(buf)
    if not n or buf[0] != _CHUNK[0]:
        return None
    length, at = _read_varint(buf, 1, n)
    if at + length != n:
        return None  # more than the chunk: leave it to protobuf
    values = [0, 0, 0, 0, 0, 0]
    data = buf[at:at]
    while at < n:
        key, at = _read_varint(buf, at, n)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            value, at = _read_varint(buf, at, n)
            if number < len(values):
                values[number] = value
        elif kind == _LEN:
            size, at = _read_varint(buf, at, n)
            if at + size > n:
                raise FrameError("a field runs past its message")
            if number == _DATA:
                data = buf[at : at + size]
            at += size
        elif kind == 1:  # 64-bit
            at += 8
        elif kind == 5:  # 32-bit
            at += 4
        else:
            raise FrameError(f"wire type {kind} in a chunk")
    if at != n:
        raise FrameError("a field runs past its message")
    offset, epoch, start, confirm = (
        _int64(values[k]) for k in (_OFFSET, _EPOCH, _EPOCH_START, _CONFIRM)
    )
    return offset, data, epoch, start, confirm


def _int64(v: int) -> int:
    """A varint read as protobuf's int64 (ten bytes for a negative number)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v
