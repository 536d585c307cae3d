"""The producer's asyncio API, ``AsyncProducer`` (the blocking ``Producer`` that runs one on a
background loop is in ``blocking``).

A send is checked, counted as unanswered, given a queue (``routing.QueueSelector``; a topic not
routed yet waits for its route) and handed to the accumulator, which batches it for the sender.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

from tidemq._runtime import Channels, nameserver_addresses
from tidemq.errors import ClientClosedError, InvalidArgumentError, TidemqError
from tidemq.producer.accumulator import Accumulator
from tidemq.producer.blocks import Block, BlockCollector
from tidemq.producer.config import ProducerConfig, ProducerStats
from tidemq.producer.delivery import delivery
from tidemq.producer.futures import Hub, MessageFuture, SendFuture, Unanswered
from tidemq.producer.idempotence import ProducerIdentity
from tidemq.producer.pending import Pending
from tidemq.producer.recall import recall_message
from tidemq.producer.routing import QueueSelector
from tidemq.producer.send_tracing import TracedBlockCollector, send_tracing
from tidemq.producer.sender import FAILOVER_POLL_S, Sender
from tidemq.producer.transaction_sends import TransactionalSends
from tidemq.producer.transactions import AsyncTransaction
from tidemq.routes import NameServerClient, RouteCache, TopicRoute
from tidemq.tracing import tracer_of
from tidemq.types import Message, SendResult, message_group_of

log = logging.getLogger(__name__)


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


def _message_group(message_group: str | None, sharding_key: str | None) -> str | None:
    try:
        return message_group_of(message_group, sharding_key)
    except ValueError as e:
        raise InvalidArgumentError(str(e), code="INVALID_ARGUMENT") from None


def is_plain(
    sharding_key: str | None,
    message_group: str | None,
    deliver_at: object,
    delay: object,
    delay_level: int | None,
) -> bool:
    """A message that may travel in a record block: no group, no delayed delivery."""
    return (
        sharding_key is None
        and message_group is None
        and deliver_at is None
        and delay is None
        and delay_level is None
    )


def _settle(future: asyncio.Future[SendResult], answered: SendFuture) -> None:
    """A block's answer for one message, handed to its asyncio future (on the loop)."""
    if future.done():
        return
    error = answered.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(answered.result())


class AsyncProducer:
    """Sends messages from an asyncio program. Use as ``async with AsyncProducer(...) as p``."""

    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        # Transactions (``transactions``): the checker answers the broker's checks; the topics
        # name where to watch for them before this producer sends a transaction itself.
        checker = settings.pop("transaction_checker", None)
        self._transaction_topics = tuple(settings.pop("transaction_topics", ()))
        # Tracing (``send_tracing``): an OpenTelemetry TracerProvider, else the global one;
        # decided here, once, so an untraced producer does no tracing work per message.
        provider = settings.pop("tracer_provider", None)
        self.config = ProducerConfig(**settings)
        self._tracing = send_tracing(tracer_of(provider), self.config.group)
        self._nameservers = nameserver_addresses(nameserver)
        self._awaiting_route: dict[str, list[Pending | Block]] = {}
        self._inbox: deque[Pending] = deque()
        self._drain_scheduled = False
        self._next_batch_id = 0
        self.stats = ProducerStats()
        self._closed = False
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels = Channels(self.config.tls, self.config.credentials)
        self._nameserver = NameServerClient(self._nameservers, self._channels)
        # Routes older than three refresh periods are re-read before use (the refresher failed).
        self.routes = RouteCache(self._nameserver, 3 * self.config.route_refresh_ms / 1000)
        # The produce path: placed on a queue by the selector, batched by the accumulator,
        # sent by the sender, answered through ``_unanswered``.
        self._unanswered = Unanswered(self.config.metrics)
        # Where the blocking API's callers wait for answers (``futures``).
        self.hub = Hub()
        # Plain messages' record blocks (``blocks``), filled from any thread once started.
        self.blocks: BlockCollector | None = None
        self.identity = (
            ProducerIdentity(self.config.producer_id) if self.config.idempotent else None
        )
        self._selector = QueueSelector(self.routes, self.config)
        self._sender = Sender(
            self.config, self._channels, self._selector, self._unanswered, self.stats, self.identity
        )
        self._accumulator = Accumulator(self.config, self._sender, self._spawn)
        self._transactions = TransactionalSends(self, checker)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> AsyncProducer:
        if not self._started:
            self._loop = asyncio.get_running_loop()
            if self.config.record_blocks:
                args = (
                    self.config,
                    self.hub,
                    self._loop,
                    self._accept_block,
                    self._accumulator.can_send,
                )
                self.blocks = (
                    BlockCollector(*args)
                    if self._tracing is None
                    else TracedBlockCollector(self._tracing, *args)
                )
                if self.config.linger_ms <= 0:
                    self._accumulator.on_idle = self.blocks.take_open
            self._started = True
            self._spawn(self._refresh_routes())
            for topic in self._transaction_topics:
                self._spawn(self._transactions.watch_topic(topic))
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Until every message accepted so far is answered (sent, or failed)."""
        if self.blocks is not None:
            self.blocks.take_open()
        self._drain()
        self._accumulator.flush()
        await self._unanswered.idle.wait()

    async def close(self) -> None:
        """Waits (up to ``send_timeout_ms``) for messages in flight, then closes the channels."""
        if self._closed:
            return
        self._closed = True
        if self.blocks is not None:
            self.blocks.close()  # refuse more; the flush below sends what came before
        try:
            await asyncio.wait_for(self.flush(), self.config.send_timeout_ms / 1000)
        except TimeoutError:
            log.warning("producer closed with %d messages unanswered", self._unanswered.count)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pending in self._inbox:
            self._unanswered.fail(pending, ClientClosedError("producer closed", code="CLOSED"))
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
    def begin_transaction(self) -> AsyncTransaction:
        """A transaction: its sends are invisible until it commits (``transactions``)."""
        self._check_open()
        return AsyncTransaction(self._transactions)

    async def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        message_group: str | None = None,
        deliver_at: dt.datetime | int | None = None,
        delay: dt.timedelta | float | None = None,
        delay_level: int | None = None,
    ) -> SendResult:
        """``deliver_at`` (a datetime, or ms since the epoch), ``delay`` (a timedelta, or
        seconds) or ``delay_level`` (1..18, RocketMQ 4's levels): the message becomes visible
        then, not now (``delivery``); its result carries ``recall_handle``."""
        self._check_open()
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        if self.blocks is not None and is_plain(sharding_key, message_group, deliver_at, delay,
                                              delay_level):  # fmt: skip
            self.blocks.add(topic, body, tag, keys, properties).add_done_callback(
                functools.partial(_settle, future)
            )
            return await future
        pending = self.pending(
            topic,
            body,
            tag,
            keys,
            properties,
            future,
            sharding_key,
            message_group=message_group,
            deliver_at=deliver_at,
            delay=delay,
            delay_level=delay_level,
        )
        self._unanswered.expect(1)
        self._accept(pending)
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
            p.delivery = delivery(m.deliver_at, m.delay, m.delay_level)
            p.batch_id = self._next_batch_id
            pendings.append(p)
        self._unanswered.expect(len(pendings))
        try:
            route = await self._selector.route(msgs[0].topic)
            queue = self._selector.select(route, pendings[0])
        except TidemqError as e:
            for p in pendings:
                self._unanswered.fail(p, e)
            raise
        for p in pendings:
            p.queue = queue
            if self.identity is not None:
                self.identity.assign(p)
        # Past the accumulator: the batch is one request already.
        await self._sender.deliver(pendings)
        return [await f for f in futures]

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a pending delayed message by the handle its send returned; returns its
        msg_id. ``DelayedMessageNotFound`` once it is delivered (or recalled already)."""
        self._check_open()
        return await recall_message(
            self.routes, self._channels, topic, recall_handle, self.config.send_timeout_ms
        )

    # ------------------------------------------------------------------ for the blocking API
    def submit_threadsafe(self, pending: Pending) -> None:
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
        # Counted once for all that is queued now; what arrives meanwhile is the next drain's.
        n = len(inbox)
        if not n:
            return
        self._unanswered.expect(n)
        for _ in range(n):
            self._accept(inbox.popleft())

    def pending(
        self,
        topic: str,
        body: bytes | str,
        tag: str | None,
        keys: Sequence[str] | str,
        properties: Mapping[str, str] | None,
        future: asyncio.Future[SendResult] | MessageFuture,
        sharding_key: str | None,
        *,
        message_group: str | None = None,
        deliver_at: dt.datetime | int | None = None,
        delay: dt.timedelta | float | None = None,
        delay_level: int | None = None,
    ) -> Pending:
        """A message checked and ready to queue (raises InvalidArgumentError when it is not)."""
        group = _message_group(message_group, sharding_key)
        when = delivery(deliver_at, delay, delay_level)
        pending = Pending(
            _check_topic(topic),
            _to_bytes(body),
            tag or "",
            _keys(keys),
            properties,
            future,
            time.monotonic() + self.config.send_timeout_ms / 1000,
            group,
        )
        pending.delivery = when
        if self._tracing is not None:
            self._tracing.trace_pending(pending)
        return pending

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("producer closed", code="CLOSED")
        if not self._started:
            raise ClientClosedError(
                "producer not started: use 'async with' or await start()", code="NOT_STARTED"
            )

    # ------------------------------------------------------------------ routing
    def _accept_block(self, block: Block) -> None:
        """A sealed record block (on the loop): counted, then placed like a message."""
        self._unanswered.expect(block.count)
        self._accept(block)

    def _accept(self, p: Pending | Block) -> None:
        """Place a counted message, once its topic's route is known."""
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
            route = await self._selector.route(topic)
        except Exception as e:  # noqa: BLE001 - whatever it is, every waiting send gets an answer
            error = e if isinstance(e, TidemqError) else TidemqError(f"{type(e).__name__}: {e}")
            for p in self._awaiting_route.pop(topic, []):
                self._unanswered.fail(p, error)
            return
        for p in self._awaiting_route.pop(topic, []):
            self._place(p, route)

    async def _place_later(self, p: Pending | Block, error: TidemqError) -> None:
        """No writable queue right now (a group changing masters): read the route again every
        ~100 ms until a master serves the topic or the send's deadline passes."""
        while time.monotonic() < p.deadline:
            await asyncio.sleep(FAILOVER_POLL_S + random.uniform(0, FAILOVER_POLL_S))
            self.routes.invalidate(p.topic)
            try:
                route = await self._selector.route(p.topic)
                self._selector.select(route, p)
            except TidemqError as e:
                if not e.retriable:
                    self._unanswered.fail(p, e)
                    return
                error = e
                continue
            self._place(p, route)
            return
        self._unanswered.fail(p, error)

    def _place(self, p: Pending | Block, route: TopicRoute) -> None:
        try:
            queue = self._selector.select(route, p)
        except TidemqError as e:
            if e.retriable and time.monotonic() < p.deadline:
                self._spawn(self._place_later(p, e))
            else:
                self._unanswered.fail(p, e)
            return
        p.queue = queue
        if self.identity is not None:
            self.identity.assign(p)
        if type(p) is Block:
            self._accumulator.append_sealed(p, queue.broker_name)
        else:
            self._accumulator.append(p, queue.broker_name)  # type: ignore[arg-type]
