"""Every receive group's in-flight state on this broker, and its snapshot.

``ReceiveStates`` maps each ``QueueKey`` to its ``QueueInFlight`` and applies the events of
``%SYS%RECEIVE_LOG`` in log order: an ``Init`` creates a queue's state (and is ignored when
it exists), a ``Reset`` creates or clears it, any other event for an unknown queue is ignored
(its group was dropped, or the snapshot it depended on is older than the event's group).

Snapshot byte format (version 1), written by the journal so a restart replays only the log
after ``position`` (the CommitLog offset just past the last applied record)::

    magic     4 bytes "TRSS"
    version   u8 = 1
    position  i64 BE
    length    u32 BE   (of the body)
    crc32     u32 BE   (zlib.crc32 of the body)
    body      := queues uv | queues x queue
    queue     := group str | topic str | queue_id i32 BE | floor uv | cursor uv
                 | slots uv | slots x (kind u8 | attempt uv | group_hash uv | lease_id uv
                                       | start_ms uv | until_ms uv)
                 | entries uv | entries x (offset_delta uv | slot_index uv)

``uv`` and ``str`` are as in ``events.py``; an entry's ``offset_delta`` is from the previous
entry's offset (the first from ``floor``), a slot is written once however many entries share
it. Anything else (magic, version, CRC, lengths, order) raises ``SnapshotFormatError``.
"""

from __future__ import annotations

import gc
import struct
import tracemalloc
import zlib
from collections.abc import Iterator

from tidemq.services.broker.receive.due_index import HELD, IN_FLIGHT, RELEASED, Slot
from tidemq.services.broker.receive.events import (
    Event,
    EventFormatError,
    Init,
    QueueKey,
    Received,
    Reset,
    _Reader,
    _str,
    _uv,
)
from tidemq.services.broker.receive.queue_state import QueueInFlight

MAGIC = b"TRSS"
VERSION = 1
_HEADER = struct.Struct(">4sBqII")


class SnapshotFormatError(ValueError):
    """The bytes are not a receive-state snapshot of a version this broker knows."""


class ReceiveStates:
    """All queues' in-flight state (pure: the journal feeds it events)."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict[QueueKey, QueueInFlight] = {}

    def apply(self, event: Event, lease_id: int) -> None:
        key = event.key
        q = self._queues.get(key)
        if q is None:
            if isinstance(event, Init):
                self._queues[key] = QueueInFlight(event.start_offset)
            elif isinstance(event, Reset):
                self._queues[key] = QueueInFlight(event.offset)
            return
        q.apply(event, lease_id)

    def get(self, key: QueueKey) -> QueueInFlight | None:
        return self._queues.get(key)

    def keys(self) -> list[QueueKey]:
        return list(self._queues)

    def keys_for(self, group: str, topic: str | None = None) -> list[QueueKey]:
        return [k for k in self._queues if k.group == group and (topic is None or k.topic == topic)]

    def drop_group(self, group: str) -> int:
        """Forget a group's queues (the group was deleted); returns how many."""
        keys = self.keys_for(group)
        for k in keys:
            del self._queues[k]
        return len(keys)

    def __iter__(self) -> Iterator[tuple[QueueKey, QueueInFlight]]:
        return iter(list(self._queues.items()))

    def __len__(self) -> int:
        return len(self._queues)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceiveStates):
            return NotImplemented
        return self._queues == other._queues

    __hash__ = None  # type: ignore[assignment]

    def open_entries(self) -> int:
        return sum(len(q) for q in self._queues.values())

    # ---- snapshot ----

    def encode_snapshot(self, position: int) -> bytes:
        body = bytearray()
        _uv(body, len(self._queues))
        for key, q in sorted(self._queues.items()):
            _str(body, key.group)
            _str(body, key.topic)
            body += struct.pack(">i", key.queue_id)
            _uv(body, q.floor)
            _uv(body, q.cursor)
            items = q.items()
            index: dict[int, int] = {}
            slots: list[Slot] = []
            for _, s in items:
                if id(s) not in index:
                    index[id(s)] = len(slots)
                    slots.append(s)
            _uv(body, len(slots))
            for s in slots:
                body.append(s.kind)
                for v in s.fields()[1:]:
                    _uv(body, v)
            _uv(body, len(items))
            prev = q.floor
            for offset, s in items:
                _uv(body, offset - prev)
                prev = offset
                _uv(body, index[id(s)])
        return _HEADER.pack(MAGIC, VERSION, position, len(body), zlib.crc32(body)) + bytes(body)

    @staticmethod
    def decode_snapshot(data: bytes) -> tuple[int, ReceiveStates]:
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise SnapshotFormatError("receive snapshot truncated in its header")
        magic, version, position, length, crc = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise SnapshotFormatError(f"not a receive snapshot (magic {magic!r})")
        if version != VERSION:
            raise SnapshotFormatError(f"receive snapshot version {version} unknown")
        body = data[_HEADER.size :]
        if len(body) != length:
            raise SnapshotFormatError(f"receive snapshot body {len(body)} bytes, header {length}")
        if zlib.crc32(body) != crc:
            raise SnapshotFormatError("receive snapshot CRC mismatch")
        if position < 0:
            raise SnapshotFormatError(f"negative snapshot position {position}")
        try:
            return position, _decode_body(body)
        except (EventFormatError, ValueError) as e:
            raise SnapshotFormatError(f"receive snapshot body: {e}") from None

    def memory_bytes_estimate(self) -> int:
        """A rough size of the state: about 110 bytes per open entry (measured in batches of
        16-32 with ``measure_bytes_per_entry``; up to 270 for leases of one message)."""
        return self.open_entries() * 110 + len(self._queues) * 1_000


def _decode_body(body: bytes) -> ReceiveStates:
    r = _Reader(body)
    states = ReceiveStates()
    for _ in range(r.count()):
        key = QueueKey(r.string(), r.string(), r.i32())
        if key in states._queues:
            raise SnapshotFormatError(f"queue {key} twice")
        floor, cursor = r.uv(), r.uv()
        slots: list[Slot] = []
        for _ in range(r.count()):
            kind = r.u8()
            if kind not in (IN_FLIGHT, RELEASED, HELD):
                raise SnapshotFormatError(f"entry kind {kind} unknown")
            slots.append(Slot(kind, r.uv(), r.uv(), r.uv(), r.uv(), r.uv()))
        items: list[tuple[int, Slot]] = []
        offset = floor
        for _ in range(r.count()):
            offset += r.uv()
            i = r.uv()
            if i >= len(slots):
                raise SnapshotFormatError(f"slot index {i} of {len(slots)}")
            items.append((offset, slots[i]))
        states._queues[key] = QueueInFlight.restore(floor, cursor, items)
    if r.pos != len(body):
        raise SnapshotFormatError(f"{len(body) - r.pos} bytes after the snapshot's queues")
    return states


def measure_bytes_per_entry(count: int = 100_000, batch: int = 32) -> float:
    """Bytes of memory per in-flight message, measured with tracemalloc: ``count`` offsets
    delivered in batches of ``batch`` (one Received event, one lease, each)."""
    key = QueueKey("bench-group", "bench-topic", 0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        states = ReceiveStates()
        states.apply(Init(key, 1_000_000_000), 1)
        now = 1_700_000_000_000
        offset = 1_000_000_000
        lease = 1 << 32
        for _ in range(count // batch):
            delivered = tuple((offset + i, 1, 0) for i in range(batch))
            offset += batch
            states.apply(Received(key, now, now + 30_000, delivered, (), (), offset), lease)
            lease += 200
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    n = states.open_entries()
    return used / n
