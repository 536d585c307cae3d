"""The events of receive/ack consumption and their byte format.

Every change of a receive group's in-flight state is one event, appended as one record body to
the system topic ``%SYS%RECEIVE_LOG`` (queue 0). Slaves replicate the records as CommitLog
bytes and rebuild the same state by applying the same events in log order; the CommitLog offset
of an event's record is its ``lease_id`` (unique, increasing, known to master and slaves alike).

Byte format (version 1). ``uv`` is an unsigned LEB128 varint (at most 10 bytes), ``zz`` a
zig-zag signed varint, ``str`` a u16 big-endian length + UTF-8::

    record   := version u8 (=1) | kind u8 | key | body
    key      := group str | topic str | queue_id i32 BE
    Init     (kind 1) := start_offset uv
    Received (kind 2) := now_ms uv | (invisible_until_ms - now_ms) zz | cursor uv
                         | n uv | n x (offset_delta zz | attempt uv | group_hash uv)
                         | n uv | n x offset_delta zz                       (filtered)
                         | n uv | n x (offset_delta zz | group_hash uv)     (held)
    Acked    (kind 3) := n uv | n x (offset_delta zz | lease_delta zz)
    Changed  (kind 4) := now_ms uv | released u8 (0/1)
                         | n uv | n x (offset_delta zz | lease_delta zz | (ms - now_ms) zz)
    Dead     (kind 5) := n uv | n x (offset_delta zz | lease_delta zz)
    Reset    (kind 6) := offset uv
    ReceivedBy (kind 7) := client str | <the fields of Received (kind 2)>

A ``Received`` that names its receiving client (the ``client_id`` of the receive call) is
written as kind 7; one without (``client_id`` empty) keeps kind 2's bytes. Brokers before kind 7
wrote only kind 2, and those records still decode (``client_id`` ""). Kind 7 exists for the
message history (``history.py``): applying it changes the state exactly as kind 2 does, on the
master and on slaves. A broker that does not know kind 7 skips such records (logging them), so
upgrade slaves before their master.

Deltas are taken from the previous item of the same list and field (the first from 0), so a
batch of neighbouring offsets costs a byte or two per offset: a Received of 32 new offsets
without message groups is about 120 bytes. Unknown versions or kinds, truncation, trailing
bytes and negative offsets raise ``EventFormatError``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

RECEIVE_LOG_TOPIC = "%SYS%RECEIVE_LOG"
VERSION = 1
KIND_INIT, KIND_RECEIVED, KIND_ACKED, KIND_CHANGED, KIND_DEAD, KIND_RESET = 1, 2, 3, 4, 5, 6
KIND_RECEIVED_BY = 7
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_MAX_VARINT_BYTES = 10
_HASH_MASK = (1 << 63) - 1


class EventFormatError(ValueError):
    """The bytes are not an event record of a version this broker knows."""


class QueueKey(NamedTuple):
    group: str
    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class Init:
    """A receive group starts on a queue: floor = cursor = ``start_offset``."""

    key: QueueKey
    start_offset: int


@dataclass(frozen=True, slots=True)
class Received:
    """One receive: deliveries under one lease (this record), new offsets filtered or held."""

    key: QueueKey
    now_ms: int
    invisible_until_ms: int
    delivered: tuple[tuple[int, int, int], ...]  # (offset, attempt, message group hash)
    filtered: tuple[int, ...]  # new offsets done: their tag did not match
    held: tuple[tuple[int, int], ...]  # FIFO: new offsets held back (offset, group hash)
    cursor: int  # new cursor (>= the old one)
    # Who received (the receive call's client id); "" when unknown (kind 2 records).
    client_id: str = ""


@dataclass(frozen=True, slots=True)
class Acked:
    key: QueueKey
    items: tuple[tuple[int, int], ...]  # (offset, lease_id)


@dataclass(frozen=True, slots=True)
class Changed:
    """Invisibility changed: the holder renews (``released`` False) or gives up (nack)."""

    key: QueueKey
    now_ms: int
    items: tuple[tuple[int, int, int], ...]  # (offset, old lease_id, new deadline / visible-at ms)
    released: bool


@dataclass(frozen=True, slots=True)
class Dead:
    """Dead-lettered: copied to ``%DLQ%<group>``, so done."""

    key: QueueKey
    items: tuple[tuple[int, int], ...]  # (offset, lease_id at the time)


@dataclass(frozen=True, slots=True)
class Reset:
    """An operator's offset reset: floor = cursor = ``offset``, everything in flight forgotten."""

    key: QueueKey
    offset: int


Event = Init | Received | Acked | Changed | Dead | Reset


# Client ids are the caller's text: the history keeps at most this much of one, so a long id
# costs every receive record little and can never make a record unwritable.
MAX_CLIENT_ID_BYTES = 255


def recorded_client_id(client_id: str) -> str:
    """``client_id`` as a ``Received`` records it: at most ``MAX_CLIENT_ID_BYTES`` of UTF-8."""
    raw = client_id.encode()
    if len(raw) <= MAX_CLIENT_ID_BYTES:
        return client_id
    return raw[:MAX_CLIENT_ID_BYTES].decode(errors="ignore")


def message_group_hash(name: str | None) -> int:
    """0 for no message group; else a stable non-zero 63-bit hash of the name."""
    if not name:
        return 0
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") & _HASH_MASK
    return h or 1


# ---- encoding ----


def _uv(out: bytearray, v: int) -> None:
    if 0 <= v < 0x80:
        out.append(v)
        return
    if v < 0:
        raise ValueError(f"negative value {v} where the format wants >= 0")
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _zz(out: bytearray, v: int) -> None:
    v = (v << 1) if v >= 0 else ((-v) << 1) - 1
    if v < 0x80:
        out.append(v)
    else:
        _uv(out, v)


def _str(out: bytearray, s: str) -> None:
    raw = s.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("name over 65535 bytes")
    out += _U16.pack(len(raw))
    out += raw


def _columns(out: bytearray, items: tuple[tuple[int, ...], ...], kinds: str) -> None:
    """Items as rows; ``kinds`` per column: 'd' zig-zag delta, 'z' zig-zag, 'u' varint."""
    _uv(out, len(items))
    # The lists of every receive and ack, written without the general loop's overhead.
    if kinds == "dd":
        p0 = p1 = 0
        for v0, v1 in items:
            _zz(out, v0 - p0)
            _zz(out, v1 - p1)
            p0, p1 = v0, v1
        return
    if kinds == "duu":
        p0 = 0
        for v0, v1, v2 in items:
            _zz(out, v0 - p0)
            _uv(out, v1)
            _uv(out, v2)
            p0 = v0
        return
    prev = [0] * len(kinds)
    for item in items:
        for i, k in enumerate(kinds):
            v = item[i]
            if k == "d":
                _zz(out, v - prev[i])
                prev[i] = v
            elif k == "z":
                _zz(out, v)
            else:
                _uv(out, v)


def encode_event(ev: Event) -> bytes:
    out = bytearray((VERSION,))
    k = ev.key
    kind = _KIND_OF[type(ev)]
    if isinstance(ev, Received) and ev.client_id:
        kind = KIND_RECEIVED_BY
    out.append(kind)
    _str(out, k.group)
    _str(out, k.topic)
    out += _I32.pack(k.queue_id)
    if isinstance(ev, Init):
        _uv(out, ev.start_offset)
    elif isinstance(ev, Received):
        if ev.client_id:
            _str(out, ev.client_id)
        _uv(out, ev.now_ms)
        _zz(out, ev.invisible_until_ms - ev.now_ms)
        _uv(out, ev.cursor)
        _check_offsets(o for o, _, _ in ev.delivered)
        _columns(out, ev.delivered, "duu")
        _check_offsets(ev.filtered)
        _columns(out, tuple((o,) for o in ev.filtered), "d")
        _check_offsets(o for o, _ in ev.held)
        _columns(out, ev.held, "du")
    elif isinstance(ev, Acked | Dead):
        _check_offsets(o for o, _ in ev.items)
        _columns(out, ev.items, "dd")
    elif isinstance(ev, Changed):
        _uv(out, ev.now_ms)
        out.append(1 if ev.released else 0)
        _check_offsets(o for o, _, _ in ev.items)
        _columns(out, tuple((o, lease, ms - ev.now_ms) for o, lease, ms in ev.items), "ddz")
    else:
        _uv(out, ev.offset)
    return bytes(out)


def _check_offsets(offsets: Iterable[int]) -> None:
    for o in offsets:
        if o < 0:
            raise ValueError(f"negative offset {o} in an event")


_KIND_OF: dict[type, int] = {
    Init: KIND_INIT,
    Received: KIND_RECEIVED,
    Acked: KIND_ACKED,
    Changed: KIND_CHANGED,
    Dead: KIND_DEAD,
    Reset: KIND_RESET,
}


# ---- decoding ----


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def u8(self) -> int:
        if self.pos >= len(self.data):
            raise EventFormatError("event record truncated")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def uv(self) -> int:
        v = 0
        for i in range(_MAX_VARINT_BYTES):
            b = self.u8()
            v |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                return v
        raise EventFormatError("varint over 10 bytes")

    def zz(self) -> int:
        v = self.uv()
        return (v >> 1) if not v & 1 else -((v + 1) >> 1)

    def string(self) -> str:
        if self.pos + 2 > len(self.data):
            raise EventFormatError("event record truncated")
        (n,) = _U16.unpack_from(self.data, self.pos)
        self.pos += 2
        if self.pos + n > len(self.data):
            raise EventFormatError("event record truncated in a name")
        try:
            s = self.data[self.pos : self.pos + n].decode()
        except UnicodeDecodeError:
            raise EventFormatError("name is not UTF-8") from None
        self.pos += n
        return s

    def i32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise EventFormatError("event record truncated")
        v: int = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def count(self) -> int:
        n = self.uv()
        # Every item takes at least a byte: a count beyond the bytes left is corruption, and
        # refusing it early keeps a bad record from allocating a huge list.
        if n > len(self.data) - self.pos:
            raise EventFormatError(f"item count {n} beyond the record's end")
        return n

    def columns(self, kinds: str) -> list[tuple[int, ...]]:
        rows = []
        prev = [0] * len(kinds)
        for _ in range(self.count()):
            row = []
            for i, k in enumerate(kinds):
                if k == "d":
                    prev[i] += self.zz()
                    row.append(prev[i])
                elif k == "z":
                    row.append(self.zz())
                else:
                    row.append(self.uv())
            if row[0] < 0:
                raise EventFormatError(f"negative offset {row[0]}")
            rows.append(tuple(row))
        return rows


def decode_event(data: bytes) -> Event:
    r = _Reader(bytes(data))
    version = r.u8()
    if version != VERSION:
        raise EventFormatError(f"event record version {version} unknown")
    kind = r.u8()
    key = QueueKey(r.string(), r.string(), r.i32())
    ev: Event
    if kind == KIND_INIT:
        ev = Init(key, r.uv())
    elif kind in (KIND_RECEIVED, KIND_RECEIVED_BY):
        client = r.string() if kind == KIND_RECEIVED_BY else ""
        now = r.uv()
        until = now + r.zz()
        cursor = r.uv()
        delivered = tuple((o, a, h) for o, a, h in r.columns("duu"))
        filtered = tuple(o for (o,) in r.columns("d"))
        held = tuple((o, h) for o, h in r.columns("du"))
        ev = Received(key, now, until, delivered, filtered, held, cursor, client)
    elif kind in (KIND_ACKED, KIND_DEAD):
        items = tuple((o, lease) for o, lease in r.columns("dd"))
        ev = Acked(key, items) if kind == KIND_ACKED else Dead(key, items)
    elif kind == KIND_CHANGED:
        now = r.uv()
        flag = r.u8()
        if flag > 1:
            raise EventFormatError(f"released flag {flag} is neither 0 nor 1")
        items3 = tuple((o, lease, now + d) for o, lease, d in r.columns("ddz"))
        ev = Changed(key, now, items3, flag == 1)
    elif kind == KIND_RESET:
        ev = Reset(key, r.uv())
    else:
        raise EventFormatError(f"event kind {kind} unknown")
    if r.pos != len(r.data):
        raise EventFormatError(f"{len(r.data) - r.pos} bytes after the event")
    return ev
