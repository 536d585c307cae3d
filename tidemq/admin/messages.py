"""Messages in the admin client: look one up by id, find a topic's messages by key or by time
range, and tell a message's life (docs/consumption.md, "A message's life").

``AsyncMessages`` is mixed into ``AsyncAdmin``, ``Messages`` into ``Admin``. A message's life is
assembled here from what its broker group knows (``GetMessageHistory``): the events of its
receive log for every receive group (deliveries, to which client, acks, nacks, changes of
invisible time, dead-lettering) and the committed offsets of the groups on its queue. A pull
(offsets) group leaves no record per message: that its committed offset is past the message is
all the broker knows, and that is all the history says (``OFFSET_COMMITTED_PAST``, no time, no
client). Nothing is invented: an event the broker did not record is not shown, and a derived one
(``INVISIBILITY_ENDED``) says what it is derived from.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq._runtime import LoopThread
from tidemq.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    RouteNotFoundError,
    TidemqError,
)
from tidemq.protos import broker_pb2
from tidemq.routes import NameServerClient, TopicRoute
from tidemq.types import ReceivedMessage

T = TypeVar("T")

MAX_FIND_LIMIT = 10_000
_PULL_BATCH = 256
_PULL_BYTES = 4 << 20
# The scan of a receive log can take a while on a broker with a long one.
HISTORY_TIMEOUT_S = 60.0


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


def msg_id_address(msg_id: str) -> str:
    """The store address an offset message id names (``ip:port``); InvalidArgumentError
    (INVALID_MESSAGE_ID) when it is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) not in (16, 28):
        raise InvalidArgumentError(
            f"{msg_id!r} is not a message id (32 or 56 hex characters)", code="INVALID_MESSAGE_ID"
        )
    addr = raw[: len(raw) - 12]
    port = int.from_bytes(raw[len(addr) : len(addr) + 4], "big")
    if len(addr) == 4:
        return ".".join(str(b) for b in addr) + f":{port}"
    hextets = [addr[i : i + 2].hex() for i in range(0, 16, 2)]
    return "[" + ":".join(hextets) + f"]:{port}"


# ---------------------------------------------------------------- assembling a life (pure)

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


# ---------------------------------------------------------------- the admin mixins


class AsyncMessages:
    """Mixed into ``AsyncAdmin``, which provides ``_call``, ``nameserver``, ``route`` and
    ``cluster_info``."""

    if TYPE_CHECKING:
        nameserver: NameServerClient

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

        async def cluster_info(self) -> Any: ...

        async def route(self, topic: str) -> TopicRoute: ...

    async def _broker_addresses(self) -> list[tuple[str, str]]:
        """(broker group, address) of every broker the nameservers know, masters first."""
        info = await self.cluster_info()
        found: list[tuple[int, str, str]] = []
        for c in info.clusters:
            for g in c.groups:
                for broker_id, address in g.addresses.items():
                    found.append((broker_id, g.broker_name, address))
        found.sort()
        return [(name, address) for _, name, address in found]

    async def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message of ``msg_id`` (an offset message id, as a send returns it): body,
        properties, where and when it was stored. Asks the broker the id names first, then
        every other broker (only the broker that stored a message answers for its id)."""
        host = msg_id_address(msg_id)
        brokers = await self._broker_addresses()
        brokers.sort(key=lambda b: b[1] != host)
        unreachable: TidemqError | None = None
        for name, address in brokers:
            try:
                resp = await self._call(
                    address, "ViewMessage", broker_pb2.ViewMessageRequest(msg_id=msg_id)
                )
            except MessageNotFoundError:
                continue
            except TidemqError as e:
                if not e.retriable:
                    raise
                unreachable = e
                continue
            return ReceivedMessage.from_proto(resp.message, name)
        if unreachable is not None:
            raise MessageNotFoundError(
                f"message {msg_id} was not found; some brokers did not answer ({unreachable})",
                code="MESSAGE_NOT_FOUND",
                retriable=True,
            )
        raise MessageNotFoundError(f"message {msg_id} was not found", code="MESSAGE_NOT_FOUND")

    async def find_messages(
        self,
        topic: str,
        *,
        key: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[ReceivedMessage]:
        """Messages of ``topic``: with ``key``, those carrying it (a key or the unique key;
        at most 64 per broker group, the index's bound), within ``[begin_ms, end_ms)`` when
        given; without, those stored in ``[begin_ms, end_ms)`` (defaults: the beginning, now).
        Merged over the topic's broker groups, oldest first by store time, at most ``limit``."""
        if not 1 <= limit <= MAX_FIND_LIMIT:
            raise InvalidArgumentError(
                f"limit must be 1..{MAX_FIND_LIMIT}, got {limit}", code="INVALID_ARGUMENT"
            )
        begin = begin_ms or 0
        end = end_ms if end_ms is not None else 2**63 - 1
        if begin < 0 or end <= begin:
            raise InvalidArgumentError(
                f"the time range [{begin_ms}, {end_ms}) is empty or negative",
                code="INVALID_ARGUMENT",
            )
        if key is not None and not key:
            raise InvalidArgumentError("key must not be empty", code="INVALID_ARGUMENT")
        route = await self.route(topic)
        if key is not None:
            found = await self._find_by_key(route, topic, key, begin, end, limit)
        else:
            found = await self._find_by_time(route, topic, begin, end, limit)
        found.sort(key=lambda m: (m.store_timestamp_ms, m.broker, m.queue_id, m.queue_offset))
        return found[:limit]

    async def _find_by_key(
        self, route: TopicRoute, topic: str, key: str, begin: int, end: int, limit: int
    ) -> list[ReceivedMessage]:
        request = broker_pb2.QueryMessageRequest(
            topic=topic,
            key=key,
            begin_timestamp_ms=begin,
            end_timestamp_ms=end,
            max_messages=limit,
        )

        async def one(name: str, address: str) -> list[ReceivedMessage]:
            resp = await self._call(address, "QueryMessage", request)
            return [
                ReceivedMessage.from_proto(m, name)
                for m in resp.messages
                if begin <= m.store_timestamp_ms < end
            ]

        calls = [
            one(name, address)
            for name, g in sorted(route.groups.items())
            if (address := g.read_address()) is not None
        ]
        return [m for found in await asyncio.gather(*calls) for m in found]

    async def _find_by_time(
        self, route: TopicRoute, topic: str, begin: int, end: int, limit: int
    ) -> list[ReceivedMessage]:
        out: list[ReceivedMessage] = []
        for mq in route.read_queues:
            address = route.groups[mq.broker_name].read_address()
            if address is not None:
                out += await self._queue_by_time(
                    address, mq.broker_name, topic, mq.queue_id, begin, end, limit
                )
        return out

    async def _queue_by_time(
        self,
        address: str,
        broker: str,
        topic: str,
        queue_id: int,
        begin: int,
        end: int,
        limit: int,
    ) -> list[ReceivedMessage]:
        """Up to ``limit`` messages of one queue stored in ``[begin, end)``, oldest first."""
        offsets = await self._call(
            address,
            "GetQueueOffsets",
            broker_pb2.GetQueueOffsetsRequest(topic=topic, queue_ids=[queue_id]),
        )
        stop = offsets.queues[0].max_offset
        start = offsets.queues[0].min_offset
        if begin > 0:
            resp = await self._call(
                address,
                "SearchOffset",
                broker_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=begin),
            )
            start = max(start, int(resp.offset))
        out: list[ReceivedMessage] = []
        offset = start
        while offset < stop and len(out) < limit:
            resp = await self._call(
                address,
                "PullMessage",
                broker_pb2.PullMessageRequest(
                    topic=topic,
                    queue_id=queue_id,
                    offset=offset,
                    max_messages=min(_PULL_BATCH, limit - len(out)),
                    max_bytes=_PULL_BYTES,
                    tag_expression="*",
                ),
            )
            for m in resp.messages:
                if m.store_timestamp_ms >= end:
                    # Store times follow offsets on a queue (one broker's clock): none later
                    # in the queue is in the range either.
                    return out
                if m.store_timestamp_ms >= begin:
                    out.append(ReceivedMessage.from_proto(m, broker))
            if resp.next_offset <= offset:
                break
            offset = resp.next_offset
        return out[:limit]

    async def message_history(self, msg_id: str) -> MessageHistory:
        """The message's life, in time order: stored (when, where, sent by which host), and for
        every consumer group what its broker recorded: deliveries (to which client, attempt,
        invisible until), changes of invisible time, nacks, the ends of unsettled deliveries,
        the ack or the dead-lettering; for pull (offsets) groups, whether their committed
        offset is past the message. ``truncated`` when the broker's scan hit its bound."""
        message = await self.view_message(msg_id)
        request = broker_pb2.GetMessageHistoryRequest(
            topic=message.topic,
            queue_id=message.queue_id,
            queue_offset=message.queue_offset,
            store_timestamp_ms=message.store_timestamp_ms,
        )
        addresses = [a for name, a in await self._broker_addresses() if name == message.broker]
        if not addresses:
            raise RouteNotFoundError(
                f"broker group {message.broker} has no broker now", code="ROUTE_NOT_FOUND"
            )
        last: TidemqError | None = None
        for address in addresses:  # the master first; any slave holds the same log
            try:
                answer = await self._call(
                    address, "GetMessageHistory", request, timeout_s=HISTORY_TIMEOUT_S
                )
            except TidemqError as e:
                if not e.retriable:
                    raise
                last = e
                continue
            return assemble_history(message, answer, int(time.time() * 1000))
        assert last is not None
        raise last


class Messages:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncMessages
        _runner: LoopThread

    def _run_messages(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def view_message(self, msg_id: str) -> ReceivedMessage:
        return self._run_messages(self._core.view_message(msg_id))

    def find_messages(
        self,
        topic: str,
        *,
        key: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[ReceivedMessage]:
        return self._run_messages(
            self._core.find_messages(topic, key=key, begin_ms=begin_ms, end_ms=end_ms, limit=limit)
        )

    def message_history(self, msg_id: str) -> MessageHistory:
        return self._run_messages(self._core.message_history(msg_id))
