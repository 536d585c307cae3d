"""Consumers: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking).

- **Clustering** (default): the group's live members split the topic's queues among themselves
  (``allocate.allocate_averagely``); each member heartbeats to the brokers and re-reads the
  membership every ``rebalance_interval_ms``, so when members come and go the queues move.
  Offsets are committed to the broker that owns each queue.
- **Reading from slaves**: when a group's master fails a call (unreachable, timed out), the
  consumer reads that group's queues from its slaves, commits there, and tries the master again
  after ``master_retry_ms``. Its position is kept: a slave that has not yet replicated as far
  as the consumer got is waited for, never read from an older offset.
- **Broadcasting**: every member reads every queue; offsets are kept in a local file per group
  and ``instance_name``, as RocketMQ's LocalFileOffsetStore.

Delivery is at least once. Each owned queue has a long-polling pull task filling a bounded
buffer; ``poll`` takes from the buffers. With ``auto_commit`` the offsets of what earlier
``poll`` calls returned are committed every ``auto_commit_interval_ms`` and at ``close``;
without it, ``commit()`` commits everything returned so far. A new group starts from the
``start_from`` position: ``"last"`` (only new messages), ``"first"``, or a timestamp in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from tidemq._runtime import Channels, LoopThread, monotonic_ms, nameserver_addresses
from tidemq.allocate import allocate_averagely
from tidemq.errors import (
    BrokerUnavailableError,
    ClientClosedError,
    RequestTimeoutError,
    TidemqError,
    from_rpc_error,
)
from tidemq.fault import FaultToleranceConfig, LatencyFaultTolerance
from tidemq.local_offsets import LocalOffsetStore, queue_key
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.routes import BrokerGroup, MessageQueue, NameServerClient, RouteCache, TopicRoute
from tidemq.types import ReceivedMessage

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0


@dataclass(frozen=True)
class ConsumerConfig:
    mode: str = "clustering"  # or "broadcasting"
    tags: str = "*"
    start_from: str | int = "last"  # "first", "last", or a timestamp in ms (new groups only)
    auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    rebalance_interval_ms: int = 5_000
    heartbeat_interval_ms: int = 10_000
    pull_batch_size: int = 32
    pull_max_bytes: int = 4 << 20
    long_poll_ms: int = 10_000
    queue_buffer_messages: int = 1_024  # per queue: pulling pauses while the buffer is full
    route_refresh_ms: int = 30_000
    client_id: str = ""  # default: host@pid@random
    instance_name: str = "DEFAULT"  # names the local offset file in broadcasting mode
    local_offsets_dir: str = ""  # default: ~/.tidemq/offsets
    # A broker group's master that failed a call is left alone this long: pulls, commits and
    # offset queries go to its slaves meanwhile, then the master is tried again.
    master_retry_ms: int = 10_000

    def __post_init__(self) -> None:
        problems = []
        if self.mode not in ("clustering", "broadcasting"):
            problems.append(f"mode must be 'clustering' or 'broadcasting', not {self.mode!r}")
        if not (self.start_from in ("first", "last") or _is_timestamp(self.start_from)):
            problems.append("start_from must be 'first', 'last' or a timestamp in ms")
        for name in (
            "auto_commit_interval_ms",
            "rebalance_interval_ms",
            "heartbeat_interval_ms",
            "pull_batch_size",
            "pull_max_bytes",
            "queue_buffer_messages",
            "route_refresh_ms",
            "master_retry_ms",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.long_poll_ms < 0:
            problems.append("long_poll_ms must be >= 0")
        if problems:
            raise ValueError("invalid consumer settings: " + "; ".join(problems))


def _is_timestamp(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


@dataclass(eq=False)
class _QueueState:
    mq: MessageQueue
    next_pull: int
    delivered: int  # everything below was returned by poll (or filtered out by tags)
    processed: int  # auto-commit: everything below was returned by an earlier poll
    committed: int
    buffer: deque[ReceivedMessage] = field(default_factory=deque)
    space: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class AsyncConsumer:
    def __init__(
        self,
        nameserver: str | Sequence[str] | None = None,
        *,
        group: str,
        topic: str | Sequence[str],
        **settings: Any,
    ) -> None:
        if not group:
            raise ValueError("group is required")
        self.group = group
        self.topics = (topic,) if isinstance(topic, str) else tuple(topic)
        if not self.topics or not all(self.topics):
            raise ValueError("at least one topic is required")
        self.config = ConsumerConfig(**settings)
        self.client_id = self.config.client_id or default_client_id()
        self._channels = Channels()
        self._nameserver = NameServerClient(nameserver_addresses(nameserver), self._channels)
        self.routes = RouteCache(self._nameserver, self.config.route_refresh_ms / 1000)
        self._owned: dict[MessageQueue, _QueueState] = {}
        self._data = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_lock = asyncio.Lock()
        self._take_from = 0
        self._started = False
        self._closed = False
        self.last_error: TidemqError | None = None
        self._local_offsets: dict[str, int] = {}
        # Brokers that just failed a call; reads go to another member of the group meanwhile.
        self._unreachable = LatencyFaultTolerance(
            FaultToleranceConfig(failure_isolation_ms=self.config.master_retry_ms)
        )
        self._local_store: LocalOffsetStore | None = None
        if self.config.mode == "broadcasting":
            base = self.config.local_offsets_dir or os.path.expanduser("~/.tidemq/offsets")
            self._local_store = LocalOffsetStore(base, group, self.config.instance_name)
            self._local_offsets = self._local_store.load()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> AsyncConsumer:
        if self._started:
            return self
        self._started = True
        await self._heartbeat_all()
        await self.rebalance()
        cfg = self.config
        self._tasks = [
            asyncio.ensure_future(self._every(cfg.heartbeat_interval_ms, self._heartbeat_all)),
            asyncio.ensure_future(self._every(cfg.rebalance_interval_ms, self.rebalance)),
        ]
        if cfg.auto_commit:
            self._tasks.append(
                asyncio.ensure_future(
                    self._every(cfg.auto_commit_interval_ms, self._commit_processed)
                )
            )
        return self

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops pulling, commits (with auto-commit: everything polled), leaves the group."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self._rebalance_lock:
            states = list(self._owned.values())
            await asyncio.gather(*(self._stop_pulling(st) for st in states))
            if self.config.auto_commit:
                for st in states:
                    st.processed = st.delivered
                await self._commit_states(states, use_processed=True)
            self._owned.clear()
        await self._unregister_all()
        await self._channels.close()

    async def _every(self, period_ms: int, fn: Any) -> None:
        while True:
            await asyncio.sleep(period_ms / 1000)
            try:
                await fn()
            except TidemqError as e:
                self.last_error = e
                log.warning("consumer %s: %s failed: %s", self.client_id, fn.__name__, e)
            except Exception:  # a periodic task must survive a bug in one round
                log.exception("consumer %s: %s failed", self.client_id, fn.__name__)

    # ------------------------------------------------------------------ polling
    def assignment(self) -> set[MessageQueue]:
        return set(self._owned)

    async def poll(self, max_messages: int = 32, timeout_s: float = 1.0) -> list[ReceivedMessage]:
        """Up to ``max_messages``, waiting up to ``timeout_s`` for the first one."""
        if self._closed:
            raise ClientClosedError("consumer closed", code="CLOSED")
        if max_messages <= 0:
            raise ValueError("max_messages must be > 0")
        if self.config.auto_commit:
            # Kafka's rule: calling poll again means the previous batch was handled.
            for st in self._owned.values():
                st.processed = st.delivered
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            self._data.clear()
            got = self._take(max_messages)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._data.wait()

    def _take(self, limit: int) -> list[ReceivedMessage]:
        states = [st for st in self._owned.values() if st.buffer]
        out: list[ReceivedMessage] = []
        if not states:
            return out
        # Start at a different queue each time so one busy queue cannot starve the others.
        self._take_from = (self._take_from + 1) % len(states)
        states = states[self._take_from :] + states[: self._take_from]
        while len(out) < limit and states:
            share = max(1, (limit - len(out)) // len(states))
            for st in list(states):
                for _ in range(min(share, limit - len(out))):
                    if not st.buffer:
                        break
                    m = st.buffer.popleft()
                    out.append(m)
                    st.delivered = m.queue_offset + 1
                if not st.buffer:
                    states.remove(st)
                    # Filtered messages between the last delivered one and next_pull count as
                    # handled too: nothing of this queue below next_pull awaits the caller.
                    st.delivered = max(st.delivered, st.next_pull)
                if len(st.buffer) < self.config.queue_buffer_messages:
                    st.space.set()
        return out

    # ------------------------------------------------------------------ offsets
    async def commit(self) -> None:
        """Commits the position after every message ``poll`` has returned so far."""
        async with self._rebalance_lock:
            await self._commit_states(list(self._owned.values()), use_processed=False)

    async def _commit_processed(self) -> None:
        async with self._rebalance_lock:
            await self._commit_states(list(self._owned.values()), use_processed=True)

    async def _commit_states(self, states: list[_QueueState], *, use_processed: bool) -> None:
        changed = False
        for st in states:
            offset = st.processed if use_processed else st.delivered
            if offset <= st.committed:
                continue
            if self.config.mode == "broadcasting":
                self._local_offsets[queue_key(st.mq)] = offset
                st.committed = offset
                changed = True
                continue
            try:
                await self._broker_call(
                    st.mq,
                    "CommitOffset",
                    broker_pb2.CommitOffsetRequest(
                        group=self.group, topic=st.mq.topic, queue_id=st.mq.queue_id, offset=offset
                    ),
                )
            except TidemqError as e:
                self.last_error = e
                log.warning("committing %s at %d failed: %s", st.mq, offset, e)
                continue
            st.committed = offset
        if changed and self._local_store is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, self._local_store.save, dict(self._local_offsets)
            )

    async def _initial_offset(self, mq: MessageQueue) -> int:
        if self.config.mode == "broadcasting":
            stored = self._local_offsets.get(queue_key(mq))
            if stored is not None:
                return stored
        else:
            resp = await self._broker_call(
                mq,
                "QueryConsumerOffset",
                broker_pb2.QueryConsumerOffsetRequest(
                    group=self.group, topic=mq.topic, queue_id=mq.queue_id
                ),
            )
            if resp.found:
                return int(resp.offset)
        start = self.config.start_from
        if isinstance(start, int):
            resp = await self._broker_call(
                mq,
                "SearchOffset",
                broker_pb2.SearchOffsetRequest(
                    topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=start
                ),
            )
            return int(resp.offset)
        resp = await self._broker_call(
            mq,
            "GetQueueOffsets",
            broker_pb2.GetQueueOffsetsRequest(topic=mq.topic, queue_ids=[mq.queue_id]),
        )
        q = resp.queues[0]
        return int(q.min_offset if start == "first" else q.max_offset)

    # ------------------------------------------------------------------ group membership
    async def _heartbeat_all(self) -> None:
        mode = (
            broker_pb2.CLUSTERING if self.config.mode == "clustering" else broker_pb2.BROADCASTING
        )
        request = broker_pb2.HeartbeatRequest(
            client_id=self.client_id,
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group=self.group,
                    mode=mode,
                    subscriptions=[
                        broker_pb2.Subscription(topic=t, tag_expression=self.config.tags)
                        for t in self.topics
                    ],
                )
            ],
        )
        addresses = await self._all_broker_addresses()
        await asyncio.gather(*(self._call(a, "Heartbeat", request) for a in addresses))

    async def _unregister_all(self) -> None:
        request = broker_pb2.UnregisterClientRequest(client_id=self.client_id)
        try:
            addresses = await self._all_broker_addresses()
        except TidemqError:
            return
        await asyncio.gather(*(self._call(a, "UnregisterClient", request) for a in addresses))

    async def _all_broker_addresses(self) -> set[str]:
        addresses: set[str] = set()
        for topic in self.topics:
            route = await self.routes.get(topic)
            for g in route.groups.values():
                addresses.update(g.addresses.values())
        return addresses

    async def _call(self, address: str, method: str, request: Any) -> Any | None:
        """Best effort (heartbeats, leaving): a failure is logged, not raised."""
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            return await getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, address)
            self.last_error = err
            log.debug("%s to %s failed: %s", method, address, err)
            return None

    async def _members(self, route: TopicRoute) -> list[str]:
        # Every member asks the same broker group (the first by name), so all see one list;
        # its slaves know the members too (heartbeats go to every broker).
        for name in sorted(route.groups):
            for address in self._read_candidates(route.groups[name]):
                resp = await self._call(
                    address, "GetConsumerList", broker_pb2.GetConsumerListRequest(group=self.group)
                )
                if resp is not None:
                    return sorted(resp.client_ids)
        raise TidemqError(
            f"no broker of topic {route.topic!r} answered the member list of {self.group!r}",
            code="UNAVAILABLE",
            retriable=True,
        )

    async def rebalance(self) -> None:
        """Re-reads routes and membership and moves queues; runs periodically by itself."""
        async with self._rebalance_lock:
            if self._closed:
                return
            wanted: set[MessageQueue] = set()
            for topic in self.topics:
                self.routes.invalidate(topic)
                route = await self.routes.get(topic)
                queues = list(route.read_queues)
                if self.config.mode == "clustering":
                    members = await self._members(route)
                    wanted.update(allocate_averagely(queues, members, self.client_id))
                else:
                    wanted.update(queues)
            revoked = [st for mq, st in self._owned.items() if mq not in wanted]
            if revoked:
                log.info("consumer %s releases %s", self.client_id, [str(s.mq) for s in revoked])
                await asyncio.gather(*(self._stop_pulling(st) for st in revoked))
                if self.config.auto_commit:
                    # Without auto-commit only the application says what is handled; the new
                    # owner starts at its last commit (at-least-once).
                    await self._commit_states(revoked, use_processed=True)
                for st in revoked:
                    del self._owned[st.mq]
            for mq in sorted(wanted - set(self._owned)):
                try:
                    offset = await self._initial_offset(mq)
                except TidemqError as e:
                    self.last_error = e
                    log.warning("cannot start %s yet: %s", mq, e)
                    continue
                st = _QueueState(mq, offset, offset, offset, offset)
                st.space.set()
                st.task = asyncio.ensure_future(self._pull_loop(st))
                self._owned[mq] = st
                log.info("consumer %s reads %s from offset %d", self.client_id, mq, offset)

    # ------------------------------------------------------------------ pulling
    async def _stop_pulling(self, st: _QueueState) -> None:
        if st.task is not None:
            st.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await st.task
            st.task = None
        st.buffer.clear()

    async def _pull_loop(self, st: _QueueState) -> None:
        backoff = 0.05
        cfg = self.config
        while True:
            if len(st.buffer) >= cfg.queue_buffer_messages:
                st.space.clear()
                await st.space.wait()
                continue
            request = broker_pb2.PullMessageRequest(
                group=self.group,
                topic=st.mq.topic,
                queue_id=st.mq.queue_id,
                offset=st.next_pull,
                max_messages=cfg.pull_batch_size,
                max_bytes=cfg.pull_max_bytes,
                tag_expression=cfg.tags,
                long_poll_timeout_ms=cfg.long_poll_ms,
            )
            try:
                address, from_master = await self._read_address(st.mq)
                resp = await self._invoke(
                    st.mq,
                    address,
                    "PullMessage",
                    request,
                    timeout_s=cfg.long_poll_ms / 1000 + CALL_TIMEOUT_S,
                )
            except TidemqError as e:
                self.last_error = e
                log.warning("pulling %s failed: %s", st.mq, e)
                self.routes.invalidate(st.mq.topic)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not from_master and resp.status == broker_pb2.OFFSET_OVERFLOW:
                # A slave behind our position (it has not replicated what the master gave us):
                # wait for it, or for the master, rather than step back and deliver twice.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = 0.05
            self._apply_pull(st, resp)

    def _apply_pull(self, st: _QueueState, resp: Any) -> None:
        status = resp.status
        if status == broker_pb2.FOUND:
            for m in resp.messages:
                st.buffer.append(ReceivedMessage.from_proto(m, st.mq.broker_name))
            st.next_pull = resp.next_offset
            self._data.set()
            return
        if status in (broker_pb2.OFFSET_TOO_SMALL, broker_pb2.OFFSET_OVERFLOW):
            # RocketMQ's correction: jump to the valid range (retention deleted the messages,
            # or the broker lost its tail); nothing below can be delivered any more.
            log.warning(
                "%s: offset %d out of range [%d, %d); continuing at %d",
                st.mq,
                st.next_pull,
                resp.min_offset,
                resp.max_offset,
                resp.next_offset,
            )
        st.next_pull = resp.next_offset
        if not st.buffer:
            st.delivered = max(st.delivered, st.next_pull)
            if status == broker_pb2.OFFSET_OVERFLOW:
                st.delivered = st.next_pull

    def _read_candidates(self, group: BrokerGroup) -> list[str]:
        """Where to read a group's queues, best first: the master unless it just failed, then
        the slaves by id (a slave that failed too goes last)."""
        now = monotonic_ms()
        ordered = [group.addresses[i] for i in sorted(group.addresses)]  # the master is id 0
        up = [a for a in ordered if self._unreachable.is_available(a, now)]
        return up + [a for a in ordered if a not in up]

    async def _read_address(self, mq: MessageQueue) -> tuple[str, bool]:
        """The broker to read ``mq`` from, and whether it is the group's master."""
        route = await self.routes.get(mq.topic)
        group = route.groups.get(mq.broker_name)
        candidates = self._read_candidates(group) if group else []
        if not candidates:
            raise TidemqError(
                f"broker group {mq.broker_name} is not in the route of {mq.topic!r}",
                code="ROUTE_NOT_FOUND",
                retriable=True,
            )
        assert group is not None
        return candidates[0], candidates[0] == group.master

    async def _invoke(
        self, mq: MessageQueue, address: str, method: str, request: Any, timeout_s: float
    ) -> Any:
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            response = await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, f"broker {mq.broker_name} at {address}")
            if isinstance(err, BrokerUnavailableError | RequestTimeoutError):
                self._unreachable.record_failure(address, monotonic_ms())
            raise err from None
        self._unreachable.record_success(address)
        return response

    async def _broker_call(
        self, mq: MessageQueue, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S
    ) -> Any:
        """A call to the broker ``mq`` is read from; offsets are committed there too (a slave
        keeps them while its master is away, and config sync never lets the master's older
        ones replace them)."""
        address, _ = await self._read_address(mq)
        return await self._invoke(mq, address, method, request, timeout_s)


class Consumer:
    """The blocking consumer::

    with tidemq.Consumer(group="billing", topic="orders", start_from="first") as consumer:
        while True:
            for message in consumer.poll(max_messages=100, timeout_s=1.0):
                handle(message)
    """

    def __init__(
        self,
        nameserver: str | Sequence[str] | None = None,
        *,
        group: str,
        topic: str | Sequence[str],
        **settings: Any,
    ) -> None:
        self._runner = LoopThread("tidemq-consumer")
        try:
            self._core = self._runner.run(self._make(nameserver, group, topic, settings))
        except BaseException:
            self._runner.stop()
            raise
        self.config = self._core.config
        self.client_id = self._core.client_id

    @staticmethod
    async def _make(
        nameserver: str | Sequence[str] | None,
        group: str,
        topic: str | Sequence[str],
        settings: dict[str, Any],
    ) -> AsyncConsumer:
        # Built on the runner's loop: its asyncio primitives belong to that loop.
        core = AsyncConsumer(nameserver, group=group, topic=topic, **settings)
        try:
            return await core.start()
        except BaseException:
            await core.close()
            raise

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self, max_messages: int = 32, timeout_s: float = 1.0) -> list[ReceivedMessage]:
        return self._runner.run(self._core.poll(max_messages, timeout_s))

    def commit(self) -> None:
        self._runner.run(self._core.commit())

    def rebalance(self) -> None:
        self._runner.run(self._core.rebalance())

    def assignment(self) -> set[MessageQueue]:
        async def get() -> set[MessageQueue]:
            return self._core.assignment()

        return self._runner.run(get())

    @property
    def last_error(self) -> TidemqError | None:
        return self._core.last_error

    def close(self) -> None:
        self._runner.finish(self._core.close)
