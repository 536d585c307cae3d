"""Receive/ack consumption on the master: receive (long polling), ack, nack, change of
invisibility and dead-lettering, each validated in full before anything is recorded.

Every decision reads the state (``ReceiveJournal.states``) and records its outcome as one event
in the same step of the event loop (``journal.append`` applies it at once): two calls can never
decide on the same state. Then the answer waits for the event's record as a send waits for its
message (``put_waits``): flushed per the flush mode, on the slaves under SYNC_MASTER,
dispatched. So an acknowledged ack survives a SIGKILL and a failover.

A broker promoted to master first applies every record its log holds (``lead``), so it decides
on the state its predecessor left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.admission_grpc import stepped_aside
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import parse_tag_expression
from tidemq.services.broker.durability import send_status
from tidemq.services.broker.groups import RECEIVE, GroupSettings, SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.put_waits import wait_dispatched, wait_durable
from tidemq.services.broker.receive.dead_letter import (
    dead_letter_copy,
    dlq_topic,
    is_system_topic,
)
from tidemq.services.broker.receive.events import (
    Acked,
    Changed,
    Dead,
    Event,
    Init,
    QueueKey,
    Reset,
)
from tidemq.services.broker.receive.handle import ReceiptHandle
from tidemq.services.broker.receive.journal import JournalBehindError, ReceiveJournal
from tidemq.services.broker.receive.queue_state import HandleStatus
from tidemq.services.broker.receive.reading import (
    QueueCandidates,
    check_start_from,
    read_one,
    received_message,
    start_offset,
)
from tidemq.services.broker.receive.refusals import (
    handle_mismatch,
    handle_refusal,
    parse_handle,
)
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.services.broker.receive.waiters import ReceiveWaiters
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.errors import ServiceError, consume_disabled, detail_of, invalid
from tidemq.storage import MessageStore, PutResult, PutStatus
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

DEFAULT_SETTINGS = GroupSettings()


class ReceiveCounters(Protocol):
    """What the service counts (``BrokerMetrics`` implements it)."""

    def received(self, group: str, messages: int, redeliveries: int) -> None: ...
    def acked(self, group: str, messages: int) -> None: ...
    def dead_lettered(self, group: str, messages: int) -> None: ...


class _Uncounted:
    def received(self, group: str, messages: int, redeliveries: int) -> None:
        pass

    def acked(self, group: str, messages: int) -> None:
        pass

    def dead_lettered(self, group: str, messages: int) -> None:
        pass


class ReceiveService:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        journal: ReceiveJournal,
        checks: BrokerChecks,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        topics: TopicManager,
        waiters: ReceiveWaiters,
        publish_topics: Callable[[], Awaitable[None]],
        replication: ReplicationServicer | None = None,
        confirm_cap: Callable[[], int | None] | None = None,
        counters: ReceiveCounters | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.journal = journal
        self.checks = checks
        self.role = checks.role
        self.groups = groups
        self.offsets = offsets
        self.topics = topics
        self.waiters = waiters
        self.publish_topics = publish_topics
        self.replication = replication
        # Under confirm_offset, receives see only what in-sync slaves hold, as pulls do.
        self._confirm_cap = confirm_cap if config.replication.confirm_offset else None
        self.counters: ReceiveCounters = counters or _Uncounted()
        self._led_epoch: int | None = None
        self._lead_lock = asyncio.Lock()
        self._rotation: dict[tuple[str, str], int] = {}
        # (queue, offset) being copied to the dead-letter queue right now: copied once.
        self._dying: set[tuple[QueueKey, int]] = set()
        journal.on_applied = self._applied

    @property
    def states(self) -> ReceiveStates:
        # The journal replaces its states when it rebuilds them: never keep them.
        return self.journal.states

    # ------------------------------------------------------------------ the master's gate
    async def lead(self) -> None:
        """Refuse unless this broker is the master and may acknowledge; a master that has not
        yet decided anything in its epoch first applies every record of its log."""
        checks = self.checks
        checks.ensure_running()
        checks.ensure_master("receive and acknowledge")
        await checks.ensure_acknowledging(0)
        if self._led_epoch == self.role.epoch:
            return
        async with self._lead_lock:
            if self._led_epoch != self.role.epoch:
                epoch = self.role.epoch
                await self.journal.catch_up_fully()
                self._led_epoch = epoch

    def _append(self, event: Event) -> tuple[int, PutResult]:
        try:
            return self.journal.append(event)
        except JournalBehindError as e:
            self._led_epoch = None  # the next call catches up first
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.NOT_MASTER,
                f"receive state is catching up with its log ({e}); retry",
                retriable=True,
            ) from None

    async def _durable(self, put: PutResult, *, what: str) -> None:
        """Wait for ``put`` as a send waits; raise unless it is as durable as a SEND_OK."""
        if self.replication is not None:
            self.replication.notify_appended()
        flushed, replicated = await wait_durable(put, self.replication, self.role.role)
        if flushed is PutStatus.PUT_OK and replicated in (None, PutStatus.PUT_OK):
            await wait_dispatched(put)
        status = send_status(flushed, replicated, may_acknowledge=self.role.may_acknowledge())
        if status is None:
            raise self.checks.not_acknowledging()
        if status is not PutStatus.PUT_OK and what:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.STORE_NOT_WRITABLE,
                f"the {what} is recorded on this broker but not durable as promised "
                f"({status.name}); retry it (a retried ack may answer MESSAGE_ALREADY_ACKED)",
                retriable=True,
            )

    def _applied(self, event: Event) -> None:
        # Acks, nacks and the like may free a FIFO message group or make a message visible.
        if not isinstance(event, Init):
            self.waiters.wake(event.key.topic)

    def _settings(self, group: str) -> GroupSettings:
        g = self.groups.get(group)
        return g.settings if g is not None else DEFAULT_SETTINGS

    # ------------------------------------------------------------------ receive
    async def receive(self, req: Any) -> broker_pb2.ReceiveMessageResponse:
        cfg = self.config
        if not req.group:
            raise invalid("group is required")
        if not 1 <= req.max_messages <= cfg.max_receive_messages:
            raise invalid(
                f"max_messages must be 1..{cfg.max_receive_messages}, got {req.max_messages}"
            )
        self._check_invisible(req.invisible_duration_ms)
        if req.long_poll_timeout_ms < 0:
            raise invalid("long_poll_timeout_ms must be >= 0")
        check_start_from(req.start_from)
        tags = parse_tag_expression(req.tag_expression)
        topic = req.topic
        if is_system_topic(topic):
            raise invalid(f"{topic!r} is a system topic", common_pb2.INVALID_TOPIC)
        tcfg = self.checks.topic(topic, for_write=False)
        if req.queue_id != -1:
            self.checks.check_queue(tcfg, req.queue_id, for_write=False)
        await self.lead()
        group = self.groups.use_model(req.group, RECEIVE, now_ms(), topics=(topic,))
        wait_ms = min(req.long_poll_timeout_ms, cfg.long_poll_max_ms)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if not group.settings.consume_enabled:
                raise consume_disabled(req.group)
            woken = self.waiters.register(topic)
            now = now_ms()
            out, put, next_ms = self._receive_now(req, group.settings, tags, tcfg, now)
            if out:
                assert put is not None
                # A receive's event lost to a failover only makes its messages visible again
                # early (at least once holds): the answer goes out whatever the slaves said.
                await self._durable(put, what="")
                redelivered = sum(1 for m in out if m.delivery_attempt > 1)
                self.counters.received(req.group, len(out), redelivered)
                return broker_pb2.ReceiveMessageResponse(messages=out)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.checks.shutting_down:
                return broker_pb2.ReceiveMessageResponse()
            if next_ms is not None:
                remaining = min(remaining, max(0, next_ms - now) / 1000 + 0.001)
            async with stepped_aside():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await woken.wait()
            await self.lead()  # a demotion while parked
            group = self.groups.get(req.group) or group

    def _queues(self, req: Any, tcfg: TopicConfig) -> list[int]:
        if req.queue_id != -1:
            return [req.queue_id]
        n = tcfg.read_queue_nums
        key = (req.group, req.topic)
        first = self._rotation.get(key, 0) % n
        self._rotation[key] = first + 1
        return [(first + i) % n for i in range(n)]

    def _receive_now(
        self,
        req: Any,
        settings: GroupSettings,
        tags: Sequence[str] | None,
        tcfg: TopicConfig,
        now: int,
    ) -> tuple[list[broker_pb2.ReceivedMessage], PutResult | None, int | None]:
        """One look at the queues, recording what it decides; no await in here. Returns the
        messages, the last put, and when a retry becomes visible (the long poll's timer)."""
        store, topic, group = self.store, req.topic, req.group
        out: list[broker_pb2.ReceivedMessage] = []
        put: PutResult | None = None
        next_ms: int | None = None
        policy, attempts = settings.retry_policy, settings.max_delivery_attempts
        cap = self._confirm_cap() if self._confirm_cap is not None else None
        until = now + req.invisible_duration_ms
        for qid in self._queues(req, tcfg):
            key = QueueKey(group, topic, qid)
            q = self.states.get(key)
            if q is None:
                committed = self.offsets.query(group, topic, qid)
                start = start_offset(store, topic, qid, req.start_from, committed)
                _, put = self._append(Init(key, start))
                q = self.states.get(key)
                assert q is not None
            lo = store.min_offset(topic, qid)
            if q.cursor < lo:
                log.warning(
                    "receive group %s on %s/%d: retention deleted offsets %d..%d before the "
                    "group received them; going on from %d",
                    group,
                    topic,
                    qid,
                    q.cursor,
                    lo - 1,
                    lo,
                )
                _, put = self._append(Reset(key, lo))
                q = self.states.get(key)
                assert q is not None
            plan = q.plan_receive(
                now,
                req.max_messages - len(out),
                QueueCandidates(store, topic, qid, tags, self.config.max_pull_response_bytes, cap),
                fifo=settings.fifo,
                max_attempts=attempts,
                policy=policy,
                max_held=self.config.receive_max_held_messages,
            )
            if plan is not None:
                lease_id, put = self._append(plan.event(key, now, until))
                for offset, attempt, _gh, message in plan.delivered:
                    m = message if message is not None else read_one(store, topic, qid, offset)
                    if m is None:
                        continue  # retention deleted it: it expires, then is dead-lettered
                    handle = ReceiptHandle(
                        self.config.broker_name, group, topic, qid, offset, lease_id, until
                    )
                    out.append(received_message(m, attempt, handle))  # type: ignore[arg-type]
            if len(out) >= req.max_messages:
                break
            t = q.next_visible_ms(now, policy, max_attempts=attempts)
            if t is not None and (next_ms is None or t < next_ms):
                next_ms = t
        return out, put, next_ms

    def _check_invisible(self, ms: int) -> None:
        lo, hi = self.config.receive_min_invisible_ms, self.config.receive_max_invisible_ms
        if not lo <= ms <= hi:
            raise invalid(f"invisible_duration_ms must be {lo}..{hi}, got {ms}")

    # ------------------------------------------------------------------ handles
    def _check_call(self, group: str, topic: str, handles: Sequence[str]) -> None:
        if not group or not topic:
            raise invalid("group and topic are required")
        if not handles:
            raise invalid("at least one receipt handle is required")
        if len(handles) > self.config.max_handles_per_call:
            raise invalid(
                f"at most {self.config.max_handles_per_call} receipt handles per call, "
                f"got {len(handles)}"
            )
        self.groups.check_model(group, RECEIVE)

    def _check(self, text: str, group: str, topic: str, now: int) -> tuple[QueueKey, ReceiptHandle]:
        """The handle's queue and fields when it is the current holder's; else the typed error
        (INVALID_RECEIPT_HANDLE, RECEIPT_HANDLE_EXPIRED, MESSAGE_ALREADY_ACKED)."""
        h = parse_handle(text)
        mismatch = handle_mismatch(h, self.config.broker_name, group, topic)
        if mismatch is not None:
            raise mismatch
        key = QueueKey(group, topic, h.queue_id)
        q = self.states.get(key)
        status = q.check(h.offset, h.lease_id, now) if q is not None else HandleStatus.UNKNOWN
        refusal = handle_refusal(status, h)
        if refusal is not None:
            raise refusal
        return key, h

    def _checked(
        self, group: str, topic: str, handles: Sequence[str], now: int
    ) -> tuple[list[broker_pb2.HandleResult], list[tuple[QueueKey, ReceiptHandle]]]:
        results = []
        valid = []
        for text in handles:
            r = broker_pb2.HandleResult(receipt_handle=text)
            try:
                valid.append(self._check(text, group, topic, now))
            except ServiceError as e:
                r.error.CopyFrom(detail_of(e))
            results.append(r)
        return results, valid

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[Any]:
        self._check_call(group, topic, handles)
        await self.lead()
        results, valid = self._checked(group, topic, handles, now_ms())
        by_key: dict[QueueKey, dict[int, int]] = {}
        for key, h in valid:
            by_key.setdefault(key, {})[h.offset] = h.lease_id
        put = None
        for key, items in by_key.items():
            _, put = self._append(Acked(key, tuple(sorted(items.items()))))
        if put is not None:
            await self._durable(put, what="ack")
            self.counters.acked(group, sum(len(i) for i in by_key.values()))
        return results

    async def nack(self, group: str, topic: str, handles: Sequence[str]) -> list[Any]:
        self._check_call(group, topic, handles)
        await self.lead()
        now = now_ms()
        results, valid = self._checked(group, topic, handles, now)
        settings = self._settings(group)
        by_key: dict[QueueKey, dict[int, tuple[int, int, int]]] = {}
        exhausted: dict[QueueKey, list[int]] = {}
        for key, h in valid:
            q = self.states.get(key)
            assert q is not None  # checked
            attempt = q.attempt(h.offset)
            visible = now + settings.retry_policy.delay_ms(max(1, attempt))
            by_key.setdefault(key, {})[h.offset] = (h.offset, h.lease_id, visible)
            if attempt >= settings.max_delivery_attempts:
                exhausted.setdefault(key, []).append(h.offset)
        put = None
        for key, items in by_key.items():
            _, put = self._append(Changed(key, now, tuple(sorted(items.values())), True))
        if put is not None:
            await self._durable(put, what="nack")
        # Used up its deliveries: to the dead-letter queue now, not at the next revive.
        for key, offsets in exhausted.items():
            await self.dead_letter_offsets(
                key, offsets, f"max delivery attempts ({settings.max_delivery_attempts})"
            )
        return results

    async def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> tuple[str, int]:
        self._check_call(group, topic, [handle])
        self._check_invisible(invisible_ms)
        await self.lead()
        now = now_ms()
        key, h = self._check(handle, group, topic, now)
        until = now + invisible_ms
        lease_id, put = self._append(Changed(key, now, ((h.offset, h.lease_id, until),), False))
        await self._durable(put, what="change of invisible duration")
        new = ReceiptHandle(h.broker_name, group, topic, h.queue_id, h.offset, lease_id, until)
        return new.encode(), until

    async def dead_letter(
        self, group: str, topic: str, handle: str, reason: str
    ) -> tuple[str, int]:
        self._check_call(group, topic, [handle])
        await self.lead()
        key, h = self._check(handle, group, topic, now_ms())
        offset = await self.dead_letter_offsets(
            key, [h.offset], reason or "dead-lettered by a consumer", held=h.lease_id
        )
        return dlq_topic(group), offset

    async def dead_letter_offsets(
        self, key: QueueKey, offsets: Sequence[int], reason: str, *, held: int | None = None
    ) -> int:
        """Copy the messages at ``offsets`` to the group's dead-letter queue, wait for the
        copies as for a send, then record them done (Dead). ``held``: the lease a consumer's
        DeadLetterMessage holds (else each offset's current lease, which nobody holds). Returns
        the queue offset of the last copy (-1 when none was made)."""
        q = self.states.get(key)
        if q is None:
            return -1
        now = now_ms()
        items: list[tuple[int, int]] = []
        copies = []
        for offset in offsets:
            lease = held if held is not None else q.lease_id(offset)
            if lease is None or (key, offset) in self._dying:
                continue
            m = read_one(self.store, key.topic, key.queue_id, offset)
            if m is None:
                log.warning(
                    "dead-lettering %s/%d offset %d of group %s: retention deleted it; marked "
                    "done without a copy",
                    key.topic,
                    key.queue_id,
                    offset,
                    key.group,
                )
            else:
                copies.append(
                    dead_letter_copy(
                        m, group=key.group, attempts=q.attempt(offset), reason=reason, now_ms=now
                    )
                )
            items.append((offset, lease))
        if not items:
            return -1
        dying = {(key, o) for o, _ in items}
        self._dying |= dying
        try:
            last = -1
            if copies:
                await self._ensure_dlq_topic(key.group)
                put = self.store.put_messages(copies)
                await self._durable(put, what="dead-letter copy")
                last = put.results[-1].queue_offset
            _, put = self._append(Dead(key, tuple(items)))
            await self._durable(put, what="dead-lettering")
        finally:
            self._dying -= dying
        self.counters.dead_lettered(key.group, len(items))
        log.info(
            "dead-lettered %d message(s) of %s/%d for group %s: %s",
            len(items),
            key.topic,
            key.queue_id,
            key.group,
            reason,
        )
        return last

    async def _ensure_dlq_topic(self, group: str) -> None:
        name = dlq_topic(group)
        if self.topics.get(name) is None:
            self.topics.upsert(TopicConfig(name, 1, 1))
            await self.publish_topics()

    async def reset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """An operator's offset reset of a receive group's queue: everything in flight there is
        forgotten and the group goes on from ``offset`` (committed as a reset too)."""
        if offset < 0:
            raise invalid(f"offset {offset} is negative")
        tcfg = self.checks.topic(topic, for_write=False)
        self.checks.check_queue(tcfg, queue_id, for_write=False)
        await self.lead()
        _, put = self._append(Reset(QueueKey(group, topic, queue_id), offset))
        await self._durable(put, what="offset reset")
        log.info("receive group %s reset on %s/%d to offset %d", group, topic, queue_id, offset)
        return self.offsets.commit(group, topic, queue_id, offset, reset=True)

    # ------------------------------------------------------------------ figures
    def state(self, group: str, topic: str) -> broker_pb2.GetReceiveStateResponse:
        if not group:
            raise invalid("group is required")
        policy = self._settings(group).retry_policy
        now = now_ms()
        out = broker_pb2.GetReceiveStateResponse()
        for key in sorted(self.states.keys_for(group, topic or None)):
            q = self.states.get(key)
            if q is None:
                continue
            inflight, retrying, held = q.counts(now, policy)
            out.queues.add(
                topic=key.topic,
                queue_id=key.queue_id,
                done_offset=q.floor,
                next_offset=q.cursor,
                inflight=inflight,
                retrying=retrying,
                blocked=held,
                max_offset=self.store.max_offset(key.topic, key.queue_id),
            )
        dlq = dlq_topic(group)
        out.dead_letters = self.store.max_offset(dlq, 0) - self.store.min_offset(dlq, 0)
        return out
