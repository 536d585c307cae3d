"""Delayed delivery on the master: the wheel of pending timers, firing what is due every
``timer_tick_ms``, recall and listing.

Firing puts the due messages in their topics and one ``Fired`` record after them in **one**
``put_messages`` call, and applies the ``Fired`` at once (``TimerJournal.applied_put``): a crash
keeps both, or the messages without the mark (delivered again after a restart: at least once),
never the mark without the messages. The wheel (``TimerWheel``, files only) is a cache: a
broker that starts leading (start-up, promotion) first applies its whole timer log, then
rebuilds the wheel from the ``%SYS%TIMER`` ConsumeQueue, whose entries carry each record's
delivery time as their tags code, so no body is read. A promoted slave thus delivers what its
old master had pending, including what fell due during the failover.

Sends made while the wheel is being rebuilt are held (a few, for a moment) and added after the
rebuild when the scan did not see them.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.event_log import LogBehindError
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.idempotence.stamp import PRODUCER_SEQ_PROPERTY
from tidemq.services.broker.leading import Leadership
from tidemq.services.broker.put_waits import wait_answerable
from tidemq.services.broker.relocate import relocated
from tidemq.services.broker.timer.events import Fired, Recalled
from tidemq.services.broker.timer.journal import TimerJournal
from tidemq.services.broker.timer.progress import fired_mark
from tidemq.services.broker.timer.recall_handle import InvalidRecallHandle, RecallHandle
from tidemq.services.broker.timer.scheduling import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_QUEUE,
    Delayed,
    Scheduling,
)
from tidemq.services.broker.timer.wheel import TimerWheel
from tidemq.services.errors import ServiceError, invalid, not_found
from tidemq.storage import Message, MessageStore, PutResult, PutStatus, StoredMessage
from tidemq.storage.clock import now_ms
from tidemq.storage.record import PROP_TIMER_DELIVER_MS, PROP_UNIQ_KEY, TIMER_TOPIC, make_msg_id

log = logging.getLogger(__name__)

# Timers fired per tick at most (one put); more wait for the next tick.
FIRE_BATCH = 2048
# At most this many batches per tick: a backlog is caught up over ticks, not in one go.
MAX_BATCHES_PER_TICK = 64
_SCAN_CHUNK = 4096
# ConsumeQueue entries a wheel rebuild adds per step of the event loop.
REBUILD_CHUNK = 16_384


class RecalledMessage(NamedTuple):
    msg_id: str  # the id tidemq's send answered: its timer record's
    client_message_id: str  # the id a RocketMQ 5 client gave it and was answered (UNIQ_KEY), or ""


class TimerCounters(Protocol):
    def delivered(self, lateness_ms: Sequence[int]) -> None: ...
    def recalled(self) -> None: ...


class _Uncounted:
    def delivered(self, lateness_ms: Sequence[int]) -> None:
        pass

    def recalled(self) -> None:
        pass


def not_pending(message: str) -> ServiceError:
    return not_found(message, common_pb2.DELAYED_MESSAGE_NOT_FOUND)


# The producer's sequence stamp stays on the timer record, where the idempotence table finds
# it (by REAL_TOPIC/REAL_QID); the delivered copy is not a second send.
_NOT_COPIED = frozenset((REAL_TOPIC, REAL_QID, "TAGS", "KEYS", PRODUCER_SEQ_PROPERTY))


def real_message(rec: StoredMessage) -> Message:
    """The message a timer record stands for, as its producer sent it; ``TIMER_DELIVER_MS``
    stays, a plain property consumers may read."""
    props = {k: v for k, v in rec.properties.items() if k not in _NOT_COPIED}
    return relocated(rec, rec.properties[REAL_TOPIC], int(rec.properties[REAL_QID]), props)


class TimerService:
    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        journal: TimerJournal,
        wheel: TimerWheel,
        checks: BrokerChecks,
        max_delay_ms: int,
        replication: ReplicationServicer | None = None,
        counters: TimerCounters | None = None,
    ) -> None:
        self.broker_name = broker_name
        self.store = store
        self.journal = journal
        self.wheel = wheel
        self.checks = checks
        self.role = checks.role
        self.replication = replication
        self.counters: TimerCounters = counters or _Uncounted()
        self.leadership = Leadership(checks, "recall or list delayed messages", self._prepare)
        # Timers stored while the wheel is not this epoch's: (due, seq, timer_id).
        self._held: list[tuple[int, int, int]] = []
        # The send path's half (``handlers/send.py``).
        self.scheduling = Scheduling(
            broker_name,
            max_delay_ms,
            lambda: self.journal.progress.delivered_up_to_ms,
            self.scheduled,
        )

    # ------------------------------------------------------------------ the send path
    def scheduled(self, delayed: Sequence[Delayed], put: PutResult) -> None:
        """The timer records of a put (in the step of the put): into the wheel."""
        for d in delayed:
            r = put.results[d.index]
            if self.leadership.prepared:
                self.wheel.add(d.deliver_at_ms, r.queue_offset, r.phy_offset)
            else:
                self._held.append((d.deliver_at_ms, r.queue_offset, r.phy_offset))

    # ------------------------------------------------------------------ leading
    async def lead(self) -> None:
        """Refuse unless master and acknowledging; the first time in an epoch, apply the whole
        timer log and rebuild the wheel."""
        await self.leadership.lead()

    async def _prepare(self) -> None:
        await self.journal.catch_up_fully()
        await self._rebuild_wheel()

    async def _rebuild_wheel(self) -> None:
        """From the queue as dispatched when it starts, a chunk per loop step (a million
        pending take seconds: other calls, heartbeats and the lease go on meanwhile). Nothing
        fires or recalls before it ends; sends made meanwhile are held, and those the scan did
        not cover are added at the end."""
        self.wheel.clear()
        progress = self.journal.progress
        stop = self.store.max_offset(TIMER_TOPIC, TIMER_QUEUE)
        seq = progress.low_seq
        while seq < stop:
            upto = min(stop, seq + REBUILD_CHUNK)
            for s, timer_id, due in self.entries(seq, upto):
                if progress.is_pending(timer_id, due, s):
                    self.wheel.add(due, s, timer_id)
            seq = upto
            await asyncio.sleep(0)
        for due, s, timer_id in self._held:
            if s >= stop:
                self.wheel.add(due, s, timer_id)
        self._held.clear()
        log.info(
            "timer wheel rebuilt: %d pending (delivered up to %d, from sequence %d)",
            self.wheel.pending_count,
            progress.delivered_up_to_ms,
            progress.low_seq,
        )

    def entries(self, start: int, stop: int | None = None) -> Iterator[tuple[int, int, int]]:
        """(seq, timer_id, due) of the ``%SYS%TIMER`` ConsumeQueue from ``start`` (to ``stop``),
        as dispatch published them: the due time is the entry's tag code, no body is read."""
        seq = start
        while stop is None or seq < stop:
            want = _SCAN_CHUNK if stop is None else min(_SCAN_CHUNK, stop - seq)
            got = self.store.queue_entries(TIMER_TOPIC, TIMER_QUEUE, seq, want)
            if not got:
                return
            for e in got:
                yield e.queue_offset, e.phy_offset, e.tag_code
            seq = got[-1].queue_offset + 1

    # ------------------------------------------------------------------ firing
    async def tick(self) -> None:
        if self.checks.shutting_down or not self.role.is_master:
            return
        if not self.role.may_acknowledge():
            return
        try:
            await self.lead()
        except ServiceError as e:  # lost the lease or the role meanwhile: the next tick sees
            log.debug("timer tick skipped: %s", e)
            return
        # Batch after batch while timers are due (a burst due at one time must not wait a tick
        # per FIRE_BATCH), yielding to other calls between batches; the last put's durability
        # covers the earlier ones.
        last: PutResult | None = None
        lateness: list[int] = []
        for _ in range(MAX_BATCHES_PER_TICK):
            put, late = self.fire(now_ms())
            if put is None:
                break
            last = put
            lateness += late
            next_due = self.wheel.next_due_ms()
            if next_due is None or next_due > now_ms():
                break
            await asyncio.sleep(0)
            if self.checks.shutting_down or not self.role.is_master:
                break
        if last is None:
            return
        await self._durable(last, "fired timers")
        self.counters.delivered(lateness)

    def fire(self, now: int) -> tuple[PutResult | None, list[int]]:
        """Put what is due and the ``Fired`` mark after it; no await in here. Nothing is
        appended while nothing falls due."""
        progress = self.journal.progress
        wheel = self.wheel
        due = wheel.pop_due(now, FIRE_BATCH)
        if not due:
            return None, []
        # A timer due a moment after its send can come up before dispatch has published its
        # record (under SYNC flush, dispatch waits for the flush): it stays pending for a
        # later tick instead of being read too early and lost.
        readable = self.store.dispatched_offset
        if any(timer_id >= readable for _, _, timer_id in due):
            for entry in due:
                if entry[2] >= readable:
                    wheel.add(*entry)
            due = [entry for entry in due if entry[2] < readable]
            if not due:
                return None, []
        # Right after the pop: the mark covers neither a cut batch's rest nor a pending timer.
        end = self.store.max_offset(TIMER_TOPIC, TIMER_QUEUE)
        event = fired_mark(now, wheel.next_due_ms(), wheel.low_seq(), end)
        messages: list[Message] = []
        lateness: list[int] = []
        for due_ms, seq, timer_id in due:
            if not progress.is_pending(timer_id, due_ms, seq):
                continue  # recalled
            try:
                rec = self.store.look_message(timer_id)
            except Exception:
                log.exception("timer record at %d unreadable; not delivered", timer_id)
                continue
            messages.append(real_message(rec))
            lateness.append(max(0, now - due_ms))
        record = self.journal.event_record(event)
        put = self.store.put_messages([*messages, record])
        self._applied(put, event, record.body)
        return put, lateness

    def _applied(self, put: PutResult, event: Fired | Recalled, body: bytes) -> None:
        try:
            self.journal.applied_put(put, event, body)
        except LogBehindError as e:
            # The next call catches up and rebuilds first.
            raise self.leadership.behind("timer state is catching up with its log", e) from None

    async def _durable(self, put: PutResult, what: str) -> None:
        status = await wait_answerable(put, self.replication, self.checks)
        if status is not PutStatus.PUT_OK:
            log.warning("%s short of durability: %s", what, status.name)

    # ------------------------------------------------------------------ recall
    async def recall(self, topic: str, text: str) -> RecalledMessage:
        """Recall a pending timer; answers (its ids) when the ``Recalled`` is durable."""
        if not topic:
            raise invalid("topic is required")
        try:
            handle = RecallHandle.decode(text)
        except InvalidRecallHandle as e:
            raise invalid(f"bad recall handle: {e}") from None
        if handle.topic != topic:
            raise invalid(f"the recall handle is for topic {handle.topic!r}, not {topic!r}")
        if handle.broker_name != self.broker_name:
            raise invalid(
                f"the recall handle is for broker group {handle.broker_name!r}, not"
                f" {self.broker_name!r}"
            )
        await self.lead()
        rec = self._timer_record(handle)
        if rec is None or not self.journal.progress.is_pending(
            handle.timer_id, handle.deliver_at_ms, rec.queue_offset
        ):
            raise not_pending(
                f"no pending delayed message for this handle on {topic!r} (delivered, recalled,"
                " or never stored here)"
            )
        event = Recalled(handle.timer_id, handle.deliver_at_ms)
        record = self.journal.event_record(event)
        put = self.store.put_messages([record])
        self._applied(put, event, record.body)
        await self._durable(put, "a recall")
        self.counters.recalled()
        return RecalledMessage(
            make_msg_id(rec.store_host, rec.phy_offset), rec.properties.get(PROP_UNIQ_KEY, "")
        )

    def _timer_record(self, handle: RecallHandle) -> StoredMessage | None:
        try:
            rec = self.store.look_message(handle.timer_id)
        except Exception:  # noqa: BLE001 - not a record's start, or gone: not pending here
            return None
        props = rec.properties
        if (
            rec.topic != TIMER_TOPIC
            or props.get(REAL_TOPIC) != handle.topic
            or props.get(PROP_TIMER_DELIVER_MS) != str(handle.deliver_at_ms)
        ):
            return None
        return rec

    # ------------------------------------------------------------------ listing
    async def list(self, topic: str, limit: int) -> Any:
        """Pending delayed messages, soonest first (at most ``limit``), and how many in all.
        Scans the ConsumeQueue from the low sequence; with a topic, reads each pending record's
        header to know its topic (an operator's call, not a hot path)."""
        if limit < 0:
            raise invalid("limit must be >= 0")
        await self.lead()
        progress = self.journal.progress
        total = 0
        soonest: list[tuple[int, int, int, StoredMessage | None]] = []
        for seq, timer_id, due in self.entries(progress.low_seq):
            if not progress.is_pending(timer_id, due, seq):
                continue
            rec: StoredMessage | None = None
            if topic:
                rec = self._look(timer_id)
                if rec is None or rec.properties.get(REAL_TOPIC) != topic:
                    continue
            total += 1
            item = (-due, -seq, timer_id, rec)
            if len(soonest) < limit:
                heapq.heappush(soonest, item)
            elif limit and item > soonest[0]:
                heapq.heapreplace(soonest, item)
        out = broker_pb2.ListDelayedMessagesResponse(total=total)
        for neg_due, _neg_seq, timer_id, read in sorted(soonest, reverse=True):
            rec = read or self._look(timer_id)
            if rec is None:
                continue
            due = -neg_due
            real = rec.properties.get(REAL_TOPIC, "")
            out.messages.add(
                topic=real,
                queue_id=int(rec.properties.get(REAL_QID, "0")),
                msg_id=make_msg_id(rec.store_host, rec.phy_offset),
                deliver_at_ms=due,
                recall_handle=RecallHandle(self.broker_name, real, timer_id, due).encode(),
                tag=rec.tags or "",
                keys=rec.keys,
                stored_at_ms=rec.store_timestamp_ms,
            )
        return out

    def _look(self, timer_id: int) -> StoredMessage | None:
        try:
            return self.store.look_message(timer_id)
        except Exception:  # noqa: BLE001 - retention took it
            return None

    def pending_count(self) -> int:
        return self.wheel.pending_count
