"""A message's life, assembled from what its broker group knows (``GetMessageHistory``): the
events of its receive log for every receive group (deliveries, to which client, acks, nacks,
changes of invisible time, dead-lettering) and the committed offsets of the groups on its queue.
Pure: the admin client (``tidemq.admin.messages``) asks, this tells.

A pull (offsets) group leaves no record per message: that its committed offset is past the
message is all the broker knows, and that is all the history says (``OFFSET_COMMITTED_PAST``, no
time, no client). Nothing is invented: an event the broker did not record is not shown, and a
derived one (``INVISIBILITY_ENDED``) says what it is derived from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tidemq.protos import broker_pb2
from tidemq.types import ReceivedMessage


class MessageEventKind(enum.StrEnum):
    STORED = "stored"
    DELIVERED = "delivered"  # the first delivery (attempt 1)
    REDELIVERED = "redelivered"  # a retry: attempt > 1
    # A delivery's invisible time ended and nothing settled it (derived from the log: a later
    # delivery of the same message, or the deadline passed with the scan complete).
    INVISIBILITY_ENDED = "invisibility_ended"
    INVISIBLE_TIME_CHANGED = "invisible_time_changed"
    NACKED = "nacked"
    ACKED = "acked"
    DEAD_LETTERED = "dead_lettered"
    FILTERED = "filtered"  # its tag did not match the group's subscription: done, never delivered
    HELD = "held"  # FIFO: held back behind an earlier message of its message group
    OFFSETS_RESET = "offsets_reset"
    # An offsets (pull) group's committed offset is beyond the message: the group consumed it.
    # When, and by which member, the broker does not record.
    OFFSET_COMMITTED_PAST = "offset_committed_past"


@dataclass(frozen=True)
class MessageEvent:
    kind: MessageEventKind
    time_ms: int | None  # None only for OFFSET_COMMITTED_PAST
    broker: str  # the broker group
    group: str | None = None  # the consumer group; None for STORED
    client_id: str | None = None  # None: not recorded (records of brokers before it was)
    attempt: int | None = None
    # DELIVERED, REDELIVERED, INVISIBLE_TIME_CHANGED: invisible until; NACKED: visible again at.
    invisible_until_ms: int | None = None
    dead_letter_topic: str | None = None
    # OFFSETS_RESET: the offset the queue was reset to; OFFSET_COMMITTED_PAST: the committed one.
    offset: int | None = None
    born_host: str | None = None  # STORED
    born_timestamp_ms: int | None = None  # STORED
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "time_ms": self.time_ms,
            "broker": self.broker,
            "group": self.group,
            "client_id": self.client_id,
            "attempt": self.attempt,
            "invisible_until_ms": self.invisible_until_ms,
            "dead_letter_topic": self.dead_letter_topic,
            "offset": self.offset,
            "born_host": self.born_host,
            "born_timestamp_ms": self.born_timestamp_ms,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class GroupOutcome:
    """Where one consumer group stands with the message."""

    group: str
    model: str  # "receive", "offsets" or "unknown"
    # "acked", "dead_lettered", "filtered", "in_flight", "waiting_retry", "held",
    # "skipped_by_reset", "consumed" (its committed offset is past it), "not_consumed"
    state: str
    deliveries: int
    committed_offset: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "model": self.model,
            "state": self.state,
            "deliveries": self.deliveries,
            "committed_offset": self.committed_offset,
        }


@dataclass(frozen=True)
class MessageHistory:
    message: ReceivedMessage
    events: list[MessageEvent]  # time order: STORED first, OFFSET_COMMITTED_PAST (no time) last
    groups: list[GroupOutcome]  # by group name
    # The broker's scan of its receive log stopped at its bound: later events may be missing.
    truncated: bool = False
    # Retention deleted receive-log records from the message's time on: earlier events may be
    # missing.
    earliest_events_deleted: bool = False
    scanned_records: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "message": self.message.as_dict(),
            "events": [e.as_dict() for e in self.events],
            "groups": [g.as_dict() for g in self.groups],
            "truncated": self.truncated,
            "earliest_events_deleted": self.earliest_events_deleted,
            "scanned_records": self.scanned_records,
            "notes": list(self.notes),
        }


_RECEIVE_KINDS = {
    broker_pb2.DELIVERED,
    broker_pb2.ACKED,
    broker_pb2.INVISIBLE_CHANGED,
    broker_pb2.NACKED,
    broker_pb2.DEAD_LETTERED,
    broker_pb2.FILTERED,
    broker_pb2.HELD,
    broker_pb2.QUEUE_RESET,
}
_MODELS = {broker_pb2.OFFSETS: "offsets", broker_pb2.RECEIVE: "receive"}


@dataclass
class _Lease:
    client_id: str | None
    attempt: int | None  # None: renewed from a delivery before the scan's start
    until_ms: int


def assemble_history(message: ReceivedMessage, answer: Any, now_ms: int) -> MessageHistory:
    """The life of ``message`` from its broker's ``GetMessageHistoryResponse``."""
    broker = message.broker
    offset = message.queue_offset
    timed: list[MessageEvent] = []
    leases: dict[int, _Lease] = {}
    open_leases: dict[str, set[int]] = {}
    log_groups: set[str] = set()

    def ended(group: str, lease_id: int, at_ms: int | None = None) -> None:
        """The lease's invisible time ran out unsettled (before ``at_ms``, when given)."""
        lease = leases[lease_id]
        if at_ms is not None and lease.until_ms > at_ms:
            return
        timed.append(
            MessageEvent(
                MessageEventKind.INVISIBILITY_ENDED,
                lease.until_ms,
                broker,
                group,
                lease.client_id,
                lease.attempt,
                detail=f"not acked within its invisible time (delivery {lease.attempt or '?'}): "
                "visible again after the group's backoff",
            )
        )

    def close(group: str, lease_id: int) -> tuple[_Lease | None, bool]:
        """The lease (None: delivered before the scan's start) and whether it was open."""
        mine = open_leases.get(group, set())
        was_open = lease_id in mine
        mine.discard(lease_id)
        return leases.get(lease_id), was_open

    for ev in answer.events:
        if ev.kind not in _RECEIVE_KINDS:
            continue  # a kind newer than this client
        g = ev.group
        log_groups.add(g)
        mine = open_leases.setdefault(g, set())
        if ev.kind == broker_pb2.DELIVERED:
            for old in sorted(mine):
                ended(g, old)
            mine.clear()
            client = ev.client_id or None
            leases[ev.lease_id] = _Lease(client, ev.attempt, ev.invisible_until_ms)
            mine.add(ev.lease_id)
            first = ev.attempt <= 1
            timed.append(
                MessageEvent(
                    MessageEventKind.DELIVERED if first else MessageEventKind.REDELIVERED,
                    ev.time_ms,
                    broker,
                    g,
                    client,
                    ev.attempt,
                    ev.invisible_until_ms,
                    detail=f"delivery {ev.attempt} to {client or 'a client not recorded'}",
                )
            )
        elif ev.kind == broker_pb2.INVISIBLE_CHANGED:
            lease, _ = close(g, ev.lease_id)
            client, attempt = (lease.client_id, lease.attempt) if lease else (None, None)
            leases[ev.new_lease_id] = _Lease(client, attempt, ev.invisible_until_ms)
            mine.add(ev.new_lease_id)
            timed.append(
                MessageEvent(
                    MessageEventKind.INVISIBLE_TIME_CHANGED,
                    ev.time_ms,
                    broker,
                    g,
                    client,
                    attempt,
                    ev.invisible_until_ms,
                    detail="invisible time changed (renewed)",
                )
            )
        elif ev.kind == broker_pb2.NACKED:
            lease, _ = close(g, ev.lease_id)
            timed.append(
                MessageEvent(
                    MessageEventKind.NACKED,
                    ev.time_ms,
                    broker,
                    g,
                    lease.client_id if lease else None,
                    lease.attempt if lease else None,
                    ev.invisible_until_ms,
                    detail="nacked: visible again at invisible_until_ms",
                )
            )
        elif ev.kind in (broker_pb2.ACKED, broker_pb2.DEAD_LETTERED):
            lease, was_open = close(g, ev.lease_id)
            dead = ev.kind == broker_pb2.DEAD_LETTERED
            if dead and was_open:
                # The revive task moves a last attempt once its invisible time has ended.
                ended(g, ev.lease_id, ev.time_ms)
            client = lease.client_id if lease else None
            attempt = lease.attempt if lease else None
            timed.append(
                MessageEvent(
                    MessageEventKind.DEAD_LETTERED if dead else MessageEventKind.ACKED,
                    ev.time_ms,
                    broker,
                    g,
                    client,
                    attempt,
                    dead_letter_topic=f"%DLQ%{g}" if dead else None,
                    detail=(
                        f"dead-lettered to %DLQ%{g}"
                        if dead
                        else f"acked with the handle of delivery {attempt or '?'}"
                    ),
                )
            )
        elif ev.kind in (broker_pb2.FILTERED, broker_pb2.HELD):
            filtered = ev.kind == broker_pb2.FILTERED
            timed.append(
                MessageEvent(
                    MessageEventKind.FILTERED if filtered else MessageEventKind.HELD,
                    ev.time_ms,
                    broker,
                    g,
                    detail=(
                        "its tag does not match the group's subscription: done, not delivered"
                        if filtered
                        else "held back behind an earlier message of its message group (FIFO)"
                    ),
                )
            )
        else:  # QUEUE_RESET
            mine.clear()
            past = ev.reset_offset > offset
            timed.append(
                MessageEvent(
                    MessageEventKind.OFFSETS_RESET,
                    ev.time_ms,
                    broker,
                    g,
                    offset=ev.reset_offset,
                    detail=(
                        f"the group's queue was reset to {ev.reset_offset}: "
                        + ("past the message, which it skips" if past else "before the message")
                    ),
                )
            )
    if not answer.truncated:
        for g, mine in open_leases.items():
            for lease_id in sorted(mine):
                if leases[lease_id].until_ms <= now_ms:
                    ended(g, lease_id)
    timed.sort(key=lambda e: e.time_ms or 0)  # stable: log order among equal times

    untimed: list[MessageEvent] = []
    outcomes: list[GroupOutcome] = []
    committed = {o.group: o for o in answer.offsets}
    for g in sorted(log_groups | set(committed)):
        entry = committed.get(g)
        model = _MODELS.get(entry.model, "unknown") if entry is not None else "unknown"
        if model == "unknown" and g in log_groups:
            model = "receive"
        position = entry.offset if entry is not None else None
        past = position is not None and position > offset
        mine_events = [e for e in timed if e.group == g]
        if model != "receive" and past:
            untimed.append(
                MessageEvent(
                    MessageEventKind.OFFSET_COMMITTED_PAST,
                    None,
                    broker,
                    g,
                    offset=position,
                    detail=f"committed offset {position} is past the message: consumed by "
                    "the group (when, and by which member, the broker does not record)",
                )
            )
        outcomes.append(
            GroupOutcome(
                g,
                model,
                _state(mine_events, past, offset, now_ms),
                sum(
                    e.kind in (MessageEventKind.DELIVERED, MessageEventKind.REDELIVERED)
                    for e in mine_events
                ),
                position,
            )
        )
    stored = MessageEvent(
        MessageEventKind.STORED,
        message.store_timestamp_ms,
        broker,
        born_host=message.born_host or None,
        born_timestamp_ms=message.born_timestamp_ms,
        detail=f"stored on {broker} in {message.topic} queue {message.queue_id} at offset "
        f"{offset}; sent by {message.born_host or 'an unknown host'}",
    )
    notes = []
    if answer.truncated:
        notes.append(
            f"the broker scanned {answer.scanned_records} receive-log records and stopped at its "
            "bound: later events may be missing"
        )
    if answer.earliest_events_deleted:
        notes.append(
            "retention deleted receive-log records of the message's time: early "
            "events may be missing"
        )
    return MessageHistory(
        message,
        [stored, *timed, *untimed],
        outcomes,
        truncated=answer.truncated,
        earliest_events_deleted=answer.earliest_events_deleted,
        scanned_records=answer.scanned_records,
        notes=notes,
    )


def _state(events: list[MessageEvent], committed_past: bool, offset: int, now_ms: int) -> str:
    """Where a group stands, from its events in time order (and its committed offset)."""
    if not events:
        return "consumed" if committed_past else "not_consumed"
    last = events[-1]
    k = last.kind
    if k is MessageEventKind.ACKED:
        return "acked"
    if k is MessageEventKind.DEAD_LETTERED:
        return "dead_lettered"
    if k is MessageEventKind.FILTERED:
        return "filtered"
    if k is MessageEventKind.HELD:
        return "held"
    if k in (MessageEventKind.NACKED, MessageEventKind.INVISIBILITY_ENDED):
        return "waiting_retry"
    if k is MessageEventKind.OFFSETS_RESET:
        return "skipped_by_reset" if (last.offset or 0) > offset else "not_consumed"
    # Delivered or changed: the scan may have stopped before its end (truncated).
    return "in_flight" if (last.invisible_until_ms or 0) > now_ms else "waiting_retry"
