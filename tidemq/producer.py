"""Producers: ``AsyncProducer`` (asyncio) and ``Producer`` (blocking, runs an AsyncProducer on a
background loop).

How a send travels:
- **Queue selection**: round robin over the topic's writable queues, skipping broker groups that
  just failed or answered slowly (``fault.LatencyFaultTolerance``); or, with a ``sharding_key``,
  always the same queue for the same key (CRC32 of the key over the sorted queue list), so one
  consumer sees that key's messages in order.
- **Automatic batching**: messages for one broker group collect in an open batch. It is sent
  when it is full (``batch_max_messages`` / ``batch_max_bytes``), when ``linger_ms`` has passed,
  or, with ``linger_ms=0``, as soon as fewer than ``max_in_flight_per_broker`` requests are
  outstanding. So a lone send goes at once, and under load sends coalesce into large RPCs
  while earlier ones are in flight.
- **Retries** (tenacity): only errors marked retriable, within ``send_timeout_ms`` in total and
  at most ``retries`` more attempts. A retry refreshes the route and moves messages without a
  sharding key to another broker group; keyed messages keep their queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from tidemq._runtime import (
    Channels,
    LoopThread,
    backoff,
    monotonic_ms,
    nameserver_addresses,
    now_ms,
)
from tidemq.errors import (
    ClientClosedError,
    InvalidArgumentError,
    RequestTimeoutError,
    RouteNotFoundError,
    TidemqError,
    from_rpc_error,
    is_retriable,
)
from tidemq.fault import FaultToleranceConfig, LatencyFaultTolerance
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.routes import MessageQueue, NameServerClient, RouteCache, TopicRoute
from tidemq.types import Message, SendResult, send_status

log = logging.getLogger(__name__)


# What a message costs in a request beyond its body (topic, tag, keys, framing): an estimate,
# only used to keep batches under batch_max_bytes.
OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class ProducerConfig:
    group: str = "DEFAULT_PRODUCER"
    batch_max_messages: int = 256
    batch_max_bytes: int = 1 << 20
    linger_ms: float = 0.0
    max_in_flight_per_broker: int = 4
    # Blocking ``send_async`` waits while this many messages are unanswered (memory bound).
    buffer_max_messages: int = 65_536
    send_timeout_ms: int = 10_000  # per message, retries included
    retries: int = 2
    route_refresh_ms: int = 30_000
    failure_isolation_ms: int = 30_000

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "batch_max_messages",
            "batch_max_bytes",
            "max_in_flight_per_broker",
            "buffer_max_messages",
            "send_timeout_ms",
            "route_refresh_ms",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        for name in ("linger_ms", "retries", "failure_isolation_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.batch_max_messages > 1024:
            problems.append("batch_max_messages must be <= 1024 (the broker's limit)")
        if problems:
            raise ValueError("invalid producer settings: " + "; ".join(problems))


@dataclass
class ProducerStats:
    """Counters since the producer started (messages count every attempt, retries included)."""

    requests: int = 0
    messages: int = 0
    failed_requests: int = 0

    @property
    def messages_per_request(self) -> float:
        return self.messages / self.requests if self.requests else 0.0


class _Retriable(Exception):
    """Inside ``_deliver``: an attempt left these messages to retry, failed with ``error``."""

    def __init__(self, error: TidemqError, left: list[_Pending]) -> None:
        super().__init__(str(error))
        self.error = error
        self.left = left


class _Pending:
    """One message on its way. The wire form is built only when its request is (once per
    attempt), straight into the request: building a Message first would copy it twice."""

    __slots__ = (
        "batch_id",
        "body",
        "born_ms",
        "deadline",
        "future",
        "keys",
        "properties",
        "queue",
        "sharding_key",
        "size",
        "tag",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        tag: str,
        keys: tuple[str, ...],
        properties: Mapping[str, str] | None,
        future: asyncio.Future[SendResult] | SendFuture,
        deadline: float,
        sharding_key: str | None,
    ) -> None:
        self.topic = topic
        self.body = body
        self.tag = tag
        self.keys = keys
        self.properties = properties
        self.born_ms = now_ms()
        self.size = len(body) + OVERHEAD_BYTES
        self.future = future
        self.deadline = deadline  # monotonic
        self.sharding_key = sharding_key
        self.queue: MessageQueue | None = None
        self.batch_id = 0  # send_batch: all of one id travel together, to one queue


@dataclass(eq=False)
class _Lane:
    """The send path to one broker group."""

    broker: str
    open: list[_Pending] = field(default_factory=list)
    open_bytes: int = 0
    ready: deque[list[_Pending]] = field(default_factory=deque)
    in_flight: int = 0
    timer: asyncio.TimerHandle | None = None
    flush_scheduled: bool = False


def _to_bytes(body: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise InvalidArgumentError(
        f"body must be bytes or str, not {type(body).__name__}", code="INVALID_ARGUMENT"
    )


def _check_topic(topic: object) -> str:
    if not isinstance(topic, str) or not topic:
        raise InvalidArgumentError("topic must be a non-empty string", code="INVALID_TOPIC")
    return topic


def _keys(keys: Sequence[str] | str) -> tuple[str, ...]:
    return (keys,) if isinstance(keys, str) else tuple(keys)


def _add_to_request(request: Any, p: _Pending) -> None:
    m = request.messages.add(
        topic=p.topic,
        body=p.body,
        queue_id=p.queue.queue_id if p.queue else 0,
        born_timestamp_ms=p.born_ms,
        tag=p.tag,
    )
    if p.keys:
        m.keys.extend(p.keys)
    if p.properties:
        m.properties.update(p.properties)


class SendFuture:
    """The answer to one ``Producer.send_async``: ``result(timeout)`` waits for it.

    Lighter than ``concurrent.futures.Future`` (no lock per message, which costs more than the
    rest of a send): one condition per producer is notified only while someone waits.
    """

    __slots__ = ("_callbacks", "_hub", "_state", "_value")

    def __init__(self, hub: _Hub) -> None:
        self._hub = hub
        self._state = 0  # 0 pending, 1 result, 2 exception
        self._value: Any = None
        self._callbacks: list[Callable[[SendFuture], None]] | None = None

    def done(self) -> bool:
        return self._state != 0

    def cancelled(self) -> bool:
        return False  # a message handed to the producer cannot be taken back

    def result(self, timeout: float | None = None) -> SendResult:
        if not self._state:
            self._hub.wait_for(self.done, timeout)
        if self._state == 2:
            raise self._value
        return self._value  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._state:
            self._hub.wait_for(self.done, timeout)
        return self._value if self._state == 2 else None

    def add_done_callback(self, fn: Callable[[SendFuture], None]) -> None:
        if self._state:
            fn(self)
        else:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(fn)

    def set_result(self, result: SendResult, *, wake: bool = True) -> None:
        """``wake=False``: the caller completes many at once and wakes waiters itself after."""
        self._value, self._state = result, 1
        self._finish(wake)

    def set_exception(self, error: BaseException) -> None:
        self._value, self._state = error, 2
        self._finish(True)

    def _finish(self, wake: bool) -> None:
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("send callback failed")
        self._hub.completed += 1
        if wake:
            self._hub.wake()

    def wake_waiters(self) -> None:
        """Wake callers blocked on this producer (after completions made with ``wake=False``)."""
        self._hub.wake()


class _Hub:
    """Where blocked callers of one Producer wait (for a result, or for buffer room)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.waiters = 0
        self.completed = 0  # written by the producer's loop thread only

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> None:
        with self.cv:
            self.waiters += 1
            try:
                if not self.cv.wait_for(predicate, timeout):
                    raise TimeoutError("no answer from the producer within the timeout")
            finally:
                self.waiters -= 1

    def wake(self) -> None:
        # Read without the lock: a waiter increments ``waiters`` before checking its predicate,
        # so either it sees the new state or this sees it waiting.
        if self.waiters:
            with self.cv:
                self.cv.notify_all()


class AsyncProducer:
    """Sends messages from an asyncio program. Use as ``async with AsyncProducer(...) as p``."""

    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        self.config = ProducerConfig(**settings)
        self._nameservers = nameserver_addresses(nameserver)
        self._fault = LatencyFaultTolerance(
            FaultToleranceConfig(failure_isolation_ms=self.config.failure_isolation_ms)
        )
        self._lanes: dict[str, _Lane] = {}
        self._round_robin: dict[str, int] = {}
        self._awaiting_route: dict[str, list[_Pending]] = {}
        self._inbox: deque[_Pending] = deque()
        self._drain_scheduled = False
        self._unfinished = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._next_batch_id = 0
        self.stats = ProducerStats()
        self._closed = False
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels = Channels()
        self._nameserver = NameServerClient(self._nameservers, self._channels)
        # Routes older than three refresh periods are re-read before use (the refresher failed).
        self.routes = RouteCache(self._nameserver, 3 * self.config.route_refresh_ms / 1000)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> AsyncProducer:
        if not self._started:
            self._loop = asyncio.get_running_loop()
            self._started = True
            self._spawn(self._refresh_routes())
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Until every message accepted so far is answered (sent, or failed)."""
        self._drain()
        for lane in self._lanes.values():
            self._seal(lane)
            self._pump(lane)
        await self._idle.wait()

    async def close(self) -> None:
        """Waits (up to ``send_timeout_ms``) for messages in flight, then closes the channels."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self.flush(), self.config.send_timeout_ms / 1000)
        except TimeoutError:
            log.warning("producer closed with %d messages unanswered", self._unfinished)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pending in self._inbox:
            self._fail(pending, ClientClosedError("producer closed", code="CLOSED"))
        await self._channels.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _refresh_routes(self) -> None:
        while True:
            await asyncio.sleep(self.config.route_refresh_ms / 1000)
            await self.routes.refresh_all()

    # ------------------------------------------------------------------ public sends
    async def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        self._check_open()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self._accept(self.pending(topic, body, tag, keys, properties, future, sharding_key))
        return await future

    async def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        """One request, appended atomically to one queue: all the messages or none.

        All messages must have the same topic (and the same sharding key, if any).
        """
        self._check_open()
        msgs = list(messages)
        if not msgs:
            return []
        if len({m.topic for m in msgs}) != 1 or len({m.sharding_key for m in msgs}) != 1:
            raise InvalidArgumentError(
                "a batch has one topic and one sharding key", code="INVALID_ARGUMENT"
            )
        loop = asyncio.get_running_loop()
        self._next_batch_id += 1
        pendings = []
        futures: list[asyncio.Future[SendResult]] = []
        for m in msgs:
            futures.append(loop.create_future())
            p = self.pending(
                m.topic, m.body, m.tag, m.keys, m.properties, futures[-1], m.sharding_key
            )
            p.batch_id = self._next_batch_id
            pendings.append(p)
        self._unfinished += len(pendings)
        self._idle.clear()
        try:
            route = await self._route(msgs[0].topic)
            queue = self._select(route, pendings[0])
        except TidemqError as e:
            for p in pendings:
                self._fail(p, e)
            raise
        for p in pendings:
            self._set_queue(p, queue)
        await self._deliver(pendings)
        return [await f for f in futures]

    # ------------------------------------------------------------------ for the blocking API
    def submit_threadsafe(self, pending: _Pending) -> None:
        """From any thread: queue a message; the loop picks up everything queued at once."""
        if self._closed or self._loop is None:
            raise ClientClosedError("producer closed", code="CLOSED")
        self._inbox.append(pending)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        # Cleared before draining: a message appended after this line schedules another drain.
        self._drain_scheduled = False
        inbox = self._inbox
        while inbox:
            self._accept(inbox.popleft())

    def pending(
        self,
        topic: str,
        body: bytes | str,
        tag: str | None,
        keys: Sequence[str] | str,
        properties: Mapping[str, str] | None,
        future: asyncio.Future[SendResult] | SendFuture,
        sharding_key: str | None,
    ) -> _Pending:
        """A message checked and ready to queue (raises InvalidArgumentError when it is not)."""
        return _Pending(
            _check_topic(topic),
            _to_bytes(body),
            tag or "",
            _keys(keys),
            properties,
            future,
            time.monotonic() + self.config.send_timeout_ms / 1000,
            sharding_key,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("producer closed", code="CLOSED")
        if not self._started:
            raise ClientClosedError(
                "producer not started: use 'async with' or await start()", code="NOT_STARTED"
            )

    # ------------------------------------------------------------------ routing
    def _accept(self, p: _Pending) -> None:
        self._unfinished += 1
        self._idle.clear()
        topic = p.topic
        route = self.routes.cached(topic)
        if route is not None:
            self._place(p, route)
            return
        waiting = self._awaiting_route.get(topic)
        if waiting is not None:
            waiting.append(p)
            return
        self._awaiting_route[topic] = [p]
        self._spawn(self._resolve(topic))

    async def _resolve(self, topic: str) -> None:
        try:
            route = await self._route(topic)
        except Exception as e:  # noqa: BLE001 - whatever it is, every waiting send gets an answer
            error = e if isinstance(e, TidemqError) else TidemqError(f"{type(e).__name__}: {e}")
            for p in self._awaiting_route.pop(topic, []):
                self._fail(p, error)
            return
        for p in self._awaiting_route.pop(topic, []):
            self._place(p, route)

    async def _route(self, topic: str) -> TopicRoute:
        attempts = AsyncRetrying(
            stop=stop_after_delay(self.config.send_timeout_ms / 1000),
            wait=backoff(),
            retry=retry_if_exception(is_retriable),
            reraise=True,
        )
        async for attempt in attempts:
            with attempt:
                return await self.routes.get(topic, allow_auto_create=True)
        raise AssertionError("unreachable: tenacity reraises")

    async def _place_later(self, p: _Pending, error: TidemqError) -> None:
        """No writable queue right now (a group changing masters): read the route again every
        ~100 ms until a master serves the topic or the send's deadline passes."""
        while time.monotonic() < p.deadline:
            await asyncio.sleep(FAILOVER_POLL_S + random.uniform(0, FAILOVER_POLL_S))
            self.routes.invalidate(p.topic)
            try:
                route = await self._route(p.topic)
                self._select(route, p)
            except TidemqError as e:
                if not e.retriable:
                    self._fail(p, e)
                    return
                error = e
                continue
            self._place(p, route)
            return
        self._fail(p, error)

    def _select(
        self, route: TopicRoute, p: _Pending, avoid: frozenset[str] = frozenset()
    ) -> MessageQueue:
        queues = route.write_queues
        if not queues:
            raise RouteNotFoundError(
                f"topic {route.topic!r} has no writable queue on any master",
                code="ROUTE_NOT_FOUND",
                retriable=True,
            )
        n = len(queues)
        if p.sharding_key is not None:
            return queues[zlib.crc32(p.sharding_key.encode()) % n]
        start = self._round_robin.get(route.topic, 0)
        self._round_robin[route.topic] = start + 1
        now = monotonic_ms()
        for i in range(n):
            q = queues[(start + i) % n]
            if q.broker_name not in avoid and self._fault.is_available(q.broker_name, now):
                return q
        # Every group is avoided or isolated: try the one that should recover first.
        candidates = {q.broker_name for q in queues} - avoid or {q.broker_name for q in queues}
        best = self._fault.pick_least_bad(sorted(candidates))
        for i in range(n):
            q = queues[(start + i) % n]
            if q.broker_name == best:
                return q
        return queues[start % n]

    @staticmethod
    def _set_queue(p: _Pending, queue: MessageQueue) -> None:
        p.queue = queue

    def _place(self, p: _Pending, route: TopicRoute) -> None:
        try:
            queue = self._select(route, p)
        except TidemqError as e:
            if e.retriable and time.monotonic() < p.deadline:
                self._spawn(self._place_later(p, e))
            else:
                self._fail(p, e)
            return
        self._set_queue(p, queue)
        lane = self._lanes.get(queue.broker_name)
        if lane is None:
            lane = self._lanes[queue.broker_name] = _Lane(queue.broker_name)
        lane.open.append(p)
        lane.open_bytes += p.size
        cfg = self.config
        if len(lane.open) >= cfg.batch_max_messages or lane.open_bytes >= cfg.batch_max_bytes:
            self._seal(lane)
            self._pump(lane)
        elif cfg.linger_ms > 0:
            if lane.timer is None:
                assert self._loop is not None
                lane.timer = self._loop.call_later(cfg.linger_ms / 1000, self._linger_done, lane)
        elif not lane.flush_scheduled:
            # Everything placed in this loop iteration (a drained inbox) shares one batch.
            lane.flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush_lane, lane)

    def _linger_done(self, lane: _Lane) -> None:
        lane.timer = None
        self._seal(lane)
        self._pump(lane)

    def _flush_lane(self, lane: _Lane) -> None:
        lane.flush_scheduled = False
        self._pump(lane)

    def _seal(self, lane: _Lane) -> None:
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        if lane.open:
            lane.ready.append(lane.open)
            lane.open, lane.open_bytes = [], 0

    def _pump(self, lane: _Lane) -> None:
        while lane.in_flight < self.config.max_in_flight_per_broker:
            if lane.ready:
                batch = lane.ready.popleft()
            elif lane.open and self.config.linger_ms == 0:
                batch, lane.open, lane.open_bytes = lane.open, [], 0
            else:
                return
            lane.in_flight += 1
            self._spawn(self._deliver_on(lane, batch))

    async def _deliver_on(self, lane: _Lane, batch: list[_Pending]) -> None:
        try:
            await self._deliver(batch)
        finally:
            lane.in_flight -= 1
            self._pump(lane)

    # ------------------------------------------------------------------ delivery
    async def _deliver(self, batch: list[_Pending]) -> None:
        """Send, retrying what failed retriably; every future ends done."""
        remaining = batch
        failed_on: set[str] = set()
        try:
            try:
                # Most batches succeed at once: the first attempt skips the retry machinery,
                # whose setup costs more than a small send.
                await self._send_once(remaining, failed_on)
            except _Retriable as e:
                remaining = e.left
                if not self.config.retries:
                    raise e.error from None
            else:
                return
            # RocketMQ retries on another broker group at once; tenacity backs off after that.
            timeout_s = max(0.0, min(p.deadline for p in remaining) - time.monotonic())
            attempts = AsyncRetrying(
                stop=_RetryBudget(self.config.retries, timeout_s),
                wait=_wait_for(backoff()),
                retry=retry_if_exception(lambda e: isinstance(e, _Retriable)),
                reraise=True,
            )
            try:
                async for attempt in attempts:
                    with attempt:
                        remaining = await self._reroute(remaining, frozenset(failed_on))
                        await self._send_once(remaining, failed_on)
            except _Retriable as e:
                remaining = e.left
                raise e.error from None
        except TidemqError as e:
            for p in remaining:
                self._fail(p, e)
        except Exception as e:  # a bug must still answer every caller
            log.exception("send failed unexpectedly")
            for p in remaining:
                self._fail(p, TidemqError(f"{type(e).__name__}: {e}"))

    async def _reroute(self, batch: list[_Pending], avoid: frozenset[str]) -> list[_Pending]:
        chosen: dict[tuple[str, int], MessageQueue] = {}
        for p in batch:
            topic = p.topic
            self.routes.invalidate(topic)
            route = await self._route(topic)
            key = (topic, p.batch_id)
            if p.batch_id and key in chosen:
                self._set_queue(p, chosen[key])
                continue
            if p.sharding_key is not None and p.queue in route.write_queues:
                queue = p.queue
            else:
                try:
                    queue = self._select(route, p, avoid)
                except TidemqError as e:
                    if not e.retriable:
                        raise
                    raise _Retriable(e, batch) from None  # no master yet: a failover
            assert queue is not None
            chosen[key] = queue
            self._set_queue(p, queue)
        return batch

    async def _send_once(self, batch: list[_Pending], failed_on: set[str]) -> None:
        """One attempt; raises ``_Retriable`` with what is left to retry (everything else is
        answered: sent, or failed for good)."""
        by_broker: dict[str, list[_Pending]] = {}
        for p in batch:
            assert p.queue is not None
            by_broker.setdefault(p.queue.broker_name, []).append(p)
        if len(by_broker) == 1:
            [(broker, group)] = by_broker.items()
            outcomes = [await self._send_to(broker, group)]
        else:
            outcomes = await asyncio.gather(
                *(self._send_to(broker, group) for broker, group in by_broker.items())
            )
        left: list[_Pending] = []
        error: TidemqError | None = None
        for broker, (group, err) in zip(by_broker, outcomes, strict=True):
            if err is None:
                continue
            if err.retriable:
                failed_on.add(broker)
                left += group
                error = error or err
            else:
                for p in group:
                    self._fail(p, err)
        if error is not None:
            raise _Retriable(error, left)

    async def _send_to(
        self, broker: str, group: list[_Pending]
    ) -> tuple[list[_Pending], TidemqError | None]:
        topic = group[0].topic
        route = self.routes.last_known(topic)
        address = None
        if route is not None and broker in route.groups:
            address = route.groups[broker].master
        if address is None:
            route = await self._route(topic)
            g = route.groups.get(broker)
            address = g.master if g else None
        if address is None:
            return group, RouteNotFoundError(
                f"broker group {broker} has no master now", code="NOT_MASTER", retriable=True
            )
        timeout_s = min(p.deadline for p in group) - time.monotonic()
        if timeout_s <= 0:
            return group, RequestTimeoutError(
                f"send timed out after {self.config.send_timeout_ms} ms",
                code="TIMEOUT",
                retriable=False,
            )
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        # The route's epoch: a superseded master refuses it (STALE_EPOCH) instead of storing.
        epoch = route.groups[broker].epoch if route is not None and broker in route.groups else 0
        request = broker_pb2.SendMessageRequest(producer_group=self.config.group, epoch=epoch)
        for p in group:
            _add_to_request(request, p)
        started = time.monotonic()
        self.stats.requests += 1
        self.stats.messages += len(group)
        try:
            resp = await stub.SendMessage(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, f"broker {broker} at {address}")
            self.stats.failed_requests += 1
            if err.retriable:
                self._fault.record_failure(broker, monotonic_ms())
            return group, err
        self._fault.record_latency(broker, (time.monotonic() - started) * 1000, monotonic_ms())
        name = resp.broker_name or broker
        epoch = resp.epoch
        for p, r in zip(group, resp.results, strict=True):
            result = SendResult(
                send_status(r.status),
                r.msg_id,
                r.queue_id,
                r.queue_offset,
                name,
                p.topic,
                r.commitlog_offset,
                epoch,
                address,
            )
            self._complete(p, result, wake=False)
        # Blocked callers are woken once for the whole answer, not once per message.
        for p in group:
            if type(p.future) is SendFuture:
                p.future.wake_waiters()
                break
        return group, None

    # ------------------------------------------------------------------ completion
    def _complete(self, p: _Pending, result: SendResult, *, wake: bool = True) -> None:
        """``wake=False``: blocked callers of the blocking API are woken by the caller."""
        future = p.future
        if not future.done():
            if type(future) is SendFuture:
                future.set_result(result, wake=wake)
            else:
                future.set_result(result)
        self._finished()

    def _fail(self, p: _Pending, error: BaseException) -> None:
        if not p.future.done():
            p.future.set_exception(error)
        self._finished()

    def _finished(self) -> None:
        self._unfinished -= 1
        if self._unfinished <= 0:
            self._unfinished = 0
            self._idle.set()


# Errors that mean "this group is changing masters": worth retrying until the send timeout,
# however many attempts that takes, since the group heals itself within seconds.
_FAILOVER_CODES = frozenset({"NOT_MASTER", "STALE_EPOCH", "ROUTE_NOT_FOUND", "UNAVAILABLE"})
FAILOVER_POLL_S = 0.05


def _failing_over(state: RetryCallState) -> bool:
    """The last attempt failed because its group is changing masters."""
    exc = state.outcome.exception() if state.outcome is not None else None
    return isinstance(exc, _Retriable) and exc.error.code in _FAILOVER_CODES


class _RetryBudget(stop_base):
    """At most ``retries`` more attempts, within ``timeout_s`` in all; a failover in progress
    (no master, a superseded one) is retried until the timeout alone."""

    def __init__(self, retries: int, timeout_s: float) -> None:
        self.retries = retries
        self.timeout_s = timeout_s

    def __call__(self, state: RetryCallState) -> bool:
        elapsed = state.seconds_since_start or 0.0
        if elapsed >= self.timeout_s:
            return True
        if _failing_over(state):
            return False
        return state.attempt_number >= self.retries


def _wait_for(other: wait_base) -> Callable[[RetryCallState], float]:
    """A failover in progress is polled every ~100 ms (a new master is elected within a
    second or two of the old one's session expiring); other errors back off as ``other``."""

    def wait(state: RetryCallState) -> float:
        if _failing_over(state):
            return FAILOVER_POLL_S + random.uniform(0, FAILOVER_POLL_S)
        return float(other(state))

    return wait


class Producer:
    """The blocking producer. ``send`` waits for the broker's answer; ``send_async`` returns a
    ``concurrent.futures.Future`` at once, so a loop of ``send_async`` calls is batched into
    few RPCs. Thread-safe. Use as a context manager, or call ``close()``::

        with tidemq.Producer(nameserver="127.0.0.1:9876") as producer:
            result = producer.send("orders", b'{"id": 1}', tag="created", keys=["order-1"])
    """

    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        self._core = AsyncProducer(nameserver, **settings)
        self.config = self._core.config
        self._hub = _Hub()
        self._submitted = 0
        self._submit_lock = threading.Lock()
        self._runner = LoopThread("tidemq-producer")
        try:
            self._runner.run(self._core.start())
        except BaseException:
            self._runner.stop()
            raise

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        return self.send_async(
            topic, body, tag=tag, keys=keys, properties=properties, sharding_key=sharding_key
        ).result()

    def send_async(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
    ) -> SendFuture:
        future = SendFuture(self._hub)
        pending = self._core.pending(topic, body, tag, keys, properties, future, sharding_key)
        limit = self.config.buffer_max_messages
        hub = self._hub
        with self._submit_lock:
            if self._submitted - hub.completed >= limit:
                # Memory bound: wait until the broker has answered enough of what is queued.
                hub.wait_for(lambda: self._submitted - hub.completed < limit, None)
            self._submitted += 1
        try:
            self._core.submit_threadsafe(pending)
        except ClientClosedError as e:
            future.set_exception(e)
        return future

    def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        return self._runner.run(self._core.send_batch(list(messages)))

    def flush(self) -> None:
        self._runner.run(self._core.flush())

    @property
    def stats(self) -> ProducerStats:
        return self._core.stats

    def close(self) -> None:
        self._runner.finish(self._core.close)
