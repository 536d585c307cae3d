"""A pull's answer, read and encoded a slice at a time on the event loop.

A 4 MiB answer costs tens of milliseconds of CPU (reading and checking the records, converting
them, encoding them). Done in one go it would hold up every other client's call for that long;
done in a thread it would fight the event loop for the GIL. So it is built in slices of a few
records, yielding to the loop between slices: other calls' steps run in between, and the pull
takes a little longer. Each slice is encoded as it is read; protobuf merges concatenated
encodings of a message (repeated fields append), so the slices joined, followed by the
answer's scalar fields, are the whole answer on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from tidemq.protos import broker_pb2
from tidemq.protos.wire import varint
from tidemq.services.broker.convert import to_proto
from tidemq.storage import GetResult, MessageStore
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

# Records per slice: about half a millisecond of work here between yields to the loop.
SLICE_MESSAGES = 8


@dataclass
class PullAnswer:
    status: int  # broker_pb2.PullStatus
    messages: int
    message_bytes: int  # record bytes, as stored
    # The PullMessageResponse on the wire, in pieces: joined once, with whatever the handler
    # adds, since each copy of a 4 MiB answer is a millisecond of the event loop.
    parts: list[bytes]

    def encoded(self, *more: bytes) -> bytes:
        """The answer on the wire, followed by ``more`` (further encoded fields: protobuf merges
        concatenated encodings of a message)."""
        if not more and len(self.parts) == 1:
            return self.parts[0]
        return b"".join((*self.parts, *more))


@dataclass(frozen=True)
class PullRange:
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    max_bytes: int
    tags: Sequence[str] | None
    max_commitlog_offset: int | None  # the confirm offset, when consumers see only that


async def read_answer(store: MessageStore, want: PullRange) -> PullAnswer | None:
    """The answer to a pull from ``want.offset``, or None at the head of the queue (nothing
    readable, nothing skipped): at most ``max_messages`` and ``max_bytes`` of records, unless
    the first alone is larger (it still comes, alone)."""
    try:
        got = _slice(store, want, want.offset, want.max_bytes)
    except (OffsetBelowMinError, OffsetBeyondMaxError) as e:
        return _out_of_range(store, want, e)
    if not got.messages and got.next_offset <= want.offset:
        return None
    # A selective tag filter scans at most this far in all, as one read would.
    scan_end = want.offset + max(want.max_messages * 16, 256)
    parts: list[bytes] = []
    count = total = 0
    lo, hi, next_offset = got.min_offset, got.max_offset, got.next_offset
    while True:
        if got.messages:
            parts.append(
                broker_pb2.PullMessageResponse(
                    messages=[to_proto(m) for m in got.messages]
                ).SerializeToString()
            )
            count += len(got.messages)
            total += sum(m.size for m in got.messages)
        lo, hi, next_offset = got.min_offset, got.max_offset, got.next_offset
        room = want.max_bytes - total
        if count >= want.max_messages or room <= 0 or next_offset >= min(hi, scan_end):
            break
        await asyncio.sleep(0)  # let other calls run
        try:
            got = _slice(store, want, next_offset, room, want.max_messages - count)
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            break  # retention moved the queue meanwhile: answer what was read
        if next_offset >= got.next_offset:
            break  # at what dispatch (or the confirm offset) has published
        if got.messages and got.messages[0].size > room:
            break  # the next record does not fit: it leads the next pull
    status = broker_pb2.FOUND if count else broker_pb2.NO_MATCHED_MESSAGE
    scalars = broker_pb2.PullMessageResponse(
        status=status, next_offset=next_offset, min_offset=lo, max_offset=hi
    )
    parts.append(scalars.SerializeToString())
    return PullAnswer(status, count, total, parts)


async def read_records_answer(store: MessageStore, want: PullRange) -> PullAnswer | None:
    """``read_answer`` for a consumer that decodes records itself (``accept_records``): the
    found records exactly as stored, back to back, in one ``records`` field. The store gathers
    and checks them in one compiled call, so there is nothing to slice."""
    try:
        got = store.get_records(
            want.topic,
            want.queue_id,
            want.offset,
            want.max_messages,
            want.max_bytes,
            want.tags,
            max_commitlog_offset=want.max_commitlog_offset,
        )
    except (OffsetBelowMinError, OffsetBeyondMaxError) as e:
        return _out_of_range(store, want, e)
    if not got.count and got.next_offset <= want.offset:
        return None
    status = broker_pb2.FOUND if got.count else broker_pb2.NO_MATCHED_MESSAGE
    scalars = broker_pb2.PullMessageResponse(
        status=status,
        next_offset=got.next_offset,
        min_offset=got.min_offset,
        max_offset=got.max_offset,
        record_count=got.count,
    ).SerializeToString()
    # The records field written by hand after the scalars (protobuf merges concatenated
    # encodings): one copy of the records into the answer instead of two.
    parts = [scalars, _RECORDS_TAG, varint(len(got.records)), got.records]
    return PullAnswer(status, got.count, len(got.records), parts)


# PullMessageResponse.records: field 7, wire type 2 (length-delimited).
_RECORDS_TAG = bytes(((7 << 3) | 2,))


def _slice(
    store: MessageStore,
    want: PullRange,
    offset: int,
    max_bytes: int,
    left: int | None = None,
) -> GetResult:
    return store.get_messages(
        want.topic,
        want.queue_id,
        offset,
        min(SLICE_MESSAGES, want.max_messages if left is None else left),
        max_bytes,
        want.tags,
        max_commitlog_offset=want.max_commitlog_offset,
    )


def _out_of_range(
    store: MessageStore, want: PullRange, e: OffsetBelowMinError | OffsetBeyondMaxError
) -> PullAnswer:
    """A pull from an offset the queue no longer (or not yet) holds: where to go on from."""
    if isinstance(e, OffsetBelowMinError):
        hi = store.max_offset(want.topic, want.queue_id)
        return _bare(broker_pb2.OFFSET_TOO_SMALL, e.min_offset, e.min_offset, hi)
    lo = store.min_offset(want.topic, want.queue_id)
    return _bare(broker_pb2.OFFSET_OVERFLOW, e.max_offset, lo, e.max_offset)


def _bare(status: int, next_offset: int, lo: int, hi: int) -> PullAnswer:
    answer = broker_pb2.PullMessageResponse(
        status=status, next_offset=next_offset, min_offset=lo, max_offset=hi
    )
    return PullAnswer(status, 0, 0, [answer.SerializeToString()])
