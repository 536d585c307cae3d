"""Receive/ack consumption on the master: receiving (long polling), and what every call of it
shares: the master's gate (``lead``), recording an event (``append``) and waiting for it as for
a send (``durable``). What becomes of received messages (ack, nack, ...) is ``settle``'s.

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

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.admission_grpc import stepped_aside
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import parse_tag_expression
from tidemq.services.broker.event_log import LogBehindError
from tidemq.services.broker.groups import RECEIVE, GroupSettings, SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.leading import Leadership
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.put_waits import wait_answerable
from tidemq.services.broker.receive.answer import ReceiveAnswer
from tidemq.services.broker.receive.dead_letter import (
    dlq_topic,
    is_system_topic,
)
from tidemq.services.broker.receive.events import (
    Event,
    Init,
    QueueKey,
    Reset,
)
from tidemq.services.broker.receive.handle import HandleWriter
from tidemq.services.broker.receive.journal import ReceiveJournal
from tidemq.services.broker.receive.reading import (
    QueueCandidates,
    check_start_from,
    read_one,
    start_offset,
)
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.services.broker.receive.waiters import ReceiveWaiters
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.errors import consume_disabled, invalid
from tidemq.storage import MessageStore, PutResult, PutStatus
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

DEFAULT_SETTINGS = GroupSettings()
_NOTHING: bytes = broker_pb2.ReceiveMessageResponse().SerializeToString()


class ReceiveCounters(Protocol):
    """What the service counts (``BrokerMetrics`` implements it)."""

    def received(self, group: str, messages: int, redeliveries: int) -> None: ...
    def acked(self, group: str, messages: int) -> None: ...
    def dead_lettered(self, group: str, messages: int) -> None: ...
    def short_durability(self, status: str) -> None: ...


class _Uncounted:
    def received(self, group: str, messages: int, redeliveries: int) -> None:
        pass

    def acked(self, group: str, messages: int) -> None:
        pass

    def dead_lettered(self, group: str, messages: int) -> None:
        pass

    def short_durability(self, status: str) -> None:
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
        self.leadership = Leadership(checks, "receive and acknowledge", journal.catch_up_fully)
        self._rotation: dict[tuple[str, str], int] = {}
        journal.on_applied = self._applied

    @property
    def states(self) -> ReceiveStates:
        # The journal replaces its states when it rebuilds them: never keep them.
        return self.journal.states

    # ------------------------------------------------------------------ the master's gate
    async def lead(self) -> None:
        """Refuse unless this broker is the master and may acknowledge; a master that has not
        yet decided anything in its epoch first applies every record of its log."""
        await self.leadership.lead()

    def append(self, event: Event) -> tuple[int, PutResult]:
        try:
            return self.journal.append(event)
        except LogBehindError as e:
            # The next call catches up first.
            raise self.leadership.behind("receive state is catching up with its log", e) from None

    async def durable(self, put: PutResult, *, what: str) -> None:
        """Wait for ``put`` as a send waits, so that normally an answered call is on the slaves.

        A record the slaves did not take in time (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT) or
        the disk did not flush in time is still answered: it is stored here, and refusing acks
        would stop consumption for as long as a SYNC_MASTER has no slave while sends carry on.
        What that costs is the documented window: such an ack can be lost by a failover, and
        its message is delivered again (at least once, never lost). Counted per outcome.
        """
        status = await wait_answerable(put, self.replication, self.checks)
        if status is not PutStatus.PUT_OK and what:
            log.warning("a %s was answered short of its durability: %s", what, status.name)
            self.counters.short_durability(status.name)

    def _applied(self, event: Event) -> None:
        # Acks, nacks and the like may free a FIFO message group or make a message visible.
        if not isinstance(event, Init):
            self.waiters.wake(event.key.topic)

    def settings(self, group: str) -> GroupSettings:
        g = self.groups.get(group)
        return g.settings if g is not None else DEFAULT_SETTINGS

    # ------------------------------------------------------------------ receive
    async def receive(self, req: Any) -> bytes:
        """The ReceiveMessageResponse, encoded (``ReceiveAnswer``)."""
        cfg = self.config
        if not req.group:
            raise invalid("group is required")
        if not 1 <= req.max_messages <= cfg.max_receive_messages:
            raise invalid(
                f"max_messages must be 1..{cfg.max_receive_messages}, got {req.max_messages}"
            )
        self.check_invisible(req.invisible_duration_ms)
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
            if out.count:
                assert put is not None
                # A receive's event lost to a failover only makes its messages visible again
                # early (at least once holds): the answer goes out whatever the slaves said.
                await self.durable(put, what="")
                self.counters.received(req.group, out.count, out.redelivered)
                return out.encoded
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.checks.shutting_down:
                return _NOTHING
            if put is not None:
                # It moved on (messages filtered out by tag, a queue started): look again,
                # after letting other calls run, rather than wait for what is already there.
                await asyncio.sleep(0)
                await self.lead()
                continue
            if next_ms is not None:
                remaining = min(remaining, max(0, next_ms - now) / 1000 + 0.001)
            async with stepped_aside():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await woken.wait()
            if self.checks.shutting_down:
                return _NOTHING  # as a parked pull answers
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
    ) -> tuple[ReceiveAnswer, PutResult | None, int | None]:
        """One look at the queues, recording what it decides; no await in here. Returns the
        messages, the last put, and when a retry becomes visible (the long poll's timer)."""
        store, topic, group = self.store, req.topic, req.group
        put: PutResult | None = None
        next_ms: int | None = None
        policy, attempts = settings.retry_policy, settings.max_delivery_attempts
        cap = self._confirm_cap() if self._confirm_cap is not None else None
        until = now + req.invisible_duration_ms
        out = ReceiveAnswer(HandleWriter(self.config.broker_name, group, topic), until)
        # New messages read for one answer stay within the pull answer's cap (retries are read
        # by offset, each at most one message).
        budget = self.config.max_pull_response_bytes
        for qid in self._queues(req, tcfg):
            key = QueueKey(group, topic, qid)
            q = self.states.get(key)
            if q is None:
                committed = self.offsets.query(group, topic, qid)
                start = start_offset(store, topic, qid, req.start_from, committed)
                _, put = self.append(Init(key, start))
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
                _, put = self.append(Reset(key, lo))
                q = self.states.get(key)
                assert q is not None
            candidates = QueueCandidates(store, topic, qid, tags, budget, cap)
            plan = q.plan_receive(
                now,
                req.max_messages - out.count,
                candidates,
                fifo=settings.fifo,
                max_attempts=attempts,
                policy=policy,
                max_held=self.config.receive_max_held_messages,
            )
            budget = candidates.max_bytes
            if plan is not None:
                lease_id, put = self.append(plan.event(key, now, until, req.client_id))
                for offset, attempt, _gh, message in plan.delivered:
                    m = message if message is not None else read_one(store, topic, qid, offset)
                    if m is None:
                        continue  # retention deleted it: it expires, then is dead-lettered
                    out.add(m, offset, attempt, lease_id)  # type: ignore[arg-type]
            if out.count >= req.max_messages or budget <= 0:
                break
            t = q.next_visible_ms(now, policy, max_attempts=attempts)
            if t is not None and (next_ms is None or t < next_ms):
                next_ms = t
        return out, put, next_ms

    def check_invisible(self, ms: int) -> None:
        lo, hi = self.config.receive_min_invisible_ms, self.config.receive_max_invisible_ms
        if not lo <= ms <= hi:
            raise invalid(f"invisible_duration_ms must be {lo}..{hi}, got {ms}")

    # ------------------------------------------------------------------ figures
    def state(self, group: str, topic: str) -> broker_pb2.GetReceiveStateResponse:
        if not group:
            raise invalid("group is required")
        policy = self.settings(group).retry_policy
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
