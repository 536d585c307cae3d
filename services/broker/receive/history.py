"""A message's life in the receive log: every event of ``%SYS%RECEIVE_LOG`` that concerns one
message (a delivery, an ack, a change of invisible time, a nack, a dead-lettering, a filter or
FIFO hold, a reset of its queue), for every receive group, and the committed offsets of every
group on its queue (GetMessageHistory; docs/consumption.md, "A message's life").

The log keeps no index by message, so the answer is a scan: from the first record stored at or
after the message (found by time in the log's own ConsumeQueue; nothing before a message's store
time can concern it) to the end of the log, bounded by records and bytes. A scan that stops at
its bound says so (``truncated``) rather than answer a life that looks complete. Most records
concern other topics: a record is decoded only when its bytes hold the topic's name as the
format writes it, so the scan costs a substring search per record.

``MessageTrail`` is pure (fed record bodies, collects events); ``scan_log`` reads the store in
chunks, yielding to the event loop between them as the journal's catch-up does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tidemq.protos import broker_pb2
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.receive.events import (
    _U16,
    RECEIVE_LOG_TOPIC,
    Acked,
    Changed,
    Dead,
    EventFormatError,
    Received,
    Reset,
    decode_event,
)
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.services.errors import invalid
from tidemq.storage import MessageStore
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

LOG_QUEUE = 0
DEFAULT_MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 64 << 20
MAX_RECORDS = 1_000_000
MAX_BYTES = 512 << 20
# Records read per step of the event loop: a long scan does not hold up other calls.
CHUNK_RECORDS = 512
_CHUNK_BYTES = 4 << 20
# The broker's clock may step back a little between a message's store and a receive of it.
CLOCK_SLACK_MS = 1_000


class MessageTrail:
    """Collects the events of one message (``topic``, ``queue_id``, ``offset``) from receive
    log records fed in log order."""

    def __init__(self, topic: str, queue_id: int, offset: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        raw = topic.encode()
        # The topic as every record of its queues carries it (u16 length + UTF-8).
        self._needle = _U16.pack(len(raw)) + raw if len(raw) <= 0xFFFF else raw
        self.events: list[broker_pb2.MessageEvent] = []
        self.undecodable = 0

    def feed(self, body: bytes, log_offset: int, store_ms: int) -> None:
        """One record of the log: its body, its CommitLog offset (the lease id of a receive's
        deliveries) and its store time (the time of events that carry none)."""
        if self._needle not in body:
            return
        try:
            ev = decode_event(body)
        except EventFormatError:
            # The journal skips such a record too (it changed no state): nothing to show.
            self.undecodable += 1
            return
        key = ev.key
        if key.topic != self.topic or key.queue_id != self.queue_id:
            return
        add = self._add
        o = self.offset
        K = broker_pb2
        if isinstance(ev, Received):
            for offset, attempt, _gh in ev.delivered:
                if offset == o:
                    add(
                        K.DELIVERED,
                        key.group,
                        ev.now_ms,
                        log_offset,
                        attempt=attempt,
                        invisible_until_ms=ev.invisible_until_ms,
                        client_id=ev.client_id,
                        lease_id=log_offset,
                    )
            if o in ev.filtered:
                add(K.FILTERED, key.group, ev.now_ms, log_offset)
            if any(offset == o for offset, _ in ev.held):
                add(K.HELD, key.group, ev.now_ms, log_offset)
        elif isinstance(ev, Acked | Dead):
            kind = K.ACKED if isinstance(ev, Acked) else K.DEAD_LETTERED
            for offset, lease in ev.items:
                if offset == o:
                    add(kind, key.group, store_ms, log_offset, lease_id=lease)
        elif isinstance(ev, Changed):
            kind = K.NACKED if ev.released else K.INVISIBLE_CHANGED
            for offset, lease, ms in ev.items:
                if offset == o:
                    add(
                        kind,
                        key.group,
                        ev.now_ms,
                        log_offset,
                        lease_id=lease,
                        new_lease_id=0 if ev.released else log_offset,
                        invisible_until_ms=ms,
                    )
        elif isinstance(ev, Reset):
            add(K.QUEUE_RESET, key.group, store_ms, log_offset, reset_offset=ev.offset)
        # An Init only says where a group starts on the queue: it names no message.

    def _add(self, kind: int, group: str, time_ms: int, log_offset: int, **fields: object) -> None:
        self.events.append(
            broker_pb2.MessageEvent(
                kind=kind, group=group, time_ms=time_ms, log_offset=log_offset, **fields
            )
        )


@dataclass
class ScanResult:
    records: int = 0
    bytes: int = 0
    truncated: bool = False
    earliest_events_deleted: bool = False
    events: list[broker_pb2.MessageEvent] = field(default_factory=list)


def scan_bounds(max_records: int, max_bytes: int) -> tuple[int, int]:
    """The request's bounds (0: the defaults), never beyond the maxima."""
    records = min(max_records or DEFAULT_MAX_RECORDS, MAX_RECORDS)
    size = min(max_bytes or DEFAULT_MAX_BYTES, MAX_BYTES)
    return records, size


async def scan_log(
    store: MessageStore, trail: MessageTrail, store_ms: int, max_records: int, max_bytes: int
) -> ScanResult:
    """Feed ``trail`` the log's records from the message's store time on; at most
    ``max_records`` records and about ``max_bytes`` of bodies."""
    out = ScanResult()
    start = store.offset_by_time(RECEIVE_LOG_TOPIC, LOG_QUEUE, store_ms - CLOCK_SLACK_MS)
    offset = start
    first = True
    while True:
        want = min(CHUNK_RECORDS, max_records - out.records)
        if want <= 0 or out.bytes >= max_bytes:
            out.truncated = offset < store.max_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE)
            break
        try:
            got = store.get_messages(RECEIVE_LOG_TOPIC, LOG_QUEUE, offset, want, _CHUNK_BYTES)
        except OffsetBelowMinError as e:
            # Retention deleted the log under the scan (or before it): go on from what is left.
            out.earliest_events_deleted = True
            offset = e.min_offset
            continue
        except OffsetBeyondMaxError:
            break
        if not got.messages:
            break
        if first:
            m = got.messages[0]
            # The scan starts at the log's first retained record, older ones existed, and
            # that record is younger than the message: what retention deleted may have
            # concerned it.
            out.earliest_events_deleted |= (
                m.queue_offset == got.min_offset
                and m.queue_offset > 0
                and m.store_timestamp_ms > store_ms
            )
            first = False
        for m in got.messages:
            trail.feed(m.body, m.phy_offset, m.store_timestamp_ms)
            out.bytes += len(m.body)
        out.records += len(got.messages)
        offset = got.next_offset
        await asyncio.sleep(0)
    out.events = trail.events
    return out


async def message_history(
    req: broker_pb2.GetMessageHistoryRequest,
    store: MessageStore,
    checks: BrokerChecks,
    offsets: OffsetManager,
    groups: SubscriptionGroupManager,
    states: ReceiveStates,
) -> broker_pb2.GetMessageHistoryResponse:
    """The GetMessageHistory answer; every bad input is a typed error before anything is read."""
    if req.max_records < 0 or req.max_bytes < 0 or req.store_timestamp_ms < 0:
        raise invalid("max_records, max_bytes and store_timestamp_ms must be >= 0")
    cfg = checks.topic(req.topic, for_write=False)
    checks.check_queue(cfg, req.queue_id, for_write=False)
    topic, qid, offset = cfg.topic, req.queue_id, req.queue_offset
    what = f"queue offset of {topic}/{qid}"
    lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
    if offset < lo:
        raise OffsetBelowMinError(what, offset, lo)
    if offset >= hi:
        raise OffsetBeyondMaxError(what, offset, hi)
    store_ms = req.store_timestamp_ms
    if not store_ms:
        found = store.get_messages(topic, qid, offset, 1).messages
        if not found:
            raise OffsetBeyondMaxError(what, offset, hi)  # not dispatched yet
        store_ms = found[0].store_timestamp_ms
    max_records, max_bytes = scan_bounds(req.max_records, req.max_bytes)
    scan = await scan_log(store, MessageTrail(topic, qid, offset), store_ms, max_records, max_bytes)
    out = broker_pb2.GetMessageHistoryResponse(
        events=scan.events,
        truncated=scan.truncated,
        earliest_events_deleted=scan.earliest_events_deleted,
        scanned_records=scan.records,
        scanned_bytes=scan.bytes,
        store_timestamp_ms=store_ms,
    )
    positions = {
        c.group: c.offset for c in offsets.entries() if c.topic == topic and c.queue_id == qid
    }
    # A receive group's applied state is newer than the floor its revive last committed.
    for key, q in states:
        if key.topic == topic and key.queue_id == qid:
            positions[key.group] = q.floor
    for group, committed in sorted(positions.items()):
        g = groups.get(group)
        model = g.model if g is not None else broker_pb2.CONSUME_MODEL_UNSPECIFIED
        out.offsets.add(group=group, offset=committed, model=model)
    return out
