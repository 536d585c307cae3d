"""``AsyncPushConsumer``, also the core of the blocking ``PushConsumer`` (``push_blocking``)
(RocketMQ 5's PushConsumer): the consumer
receives and calls a listener for each message; the listener answers ``ConsumeResult.SUCCESS``
(the message is acked) or ``FAILURE`` (it is retried after the group's backoff). An exception,
or any other answer, counts as FAILURE.

At most ``max_concurrency`` listeners run at once; the consumer keeps up to
``buffer_messages`` more received ahead, so a listener that finishes starts the next message
without waiting on a receive call. Every received message is held from its receipt: a
buffered message or a listener that runs long has its invisibility renewed (``renewal``).
Acks are batched (``acks``). ``close`` stops receiving, lets the running and buffered
listeners finish (up to ``shutdown_timeout_ms``), and sends the acks still waiting. What a
listener's answer means, and the counters, are in ``push_listening``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
import random
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from tidemq._runtime import monotonic_ms
from tidemq.consumer.acks import AckBatcher
from tidemq.consumer.config import default_client_id
from tidemq.consumer.consume_tracing import consume_tracing
from tidemq.consumer.listener_threads import ListenerThreads
from tidemq.consumer.push_listening import (
    AsyncListener,
    Listener,
    PushStats,
    consume_outcome,
    log_listener_error,
)
from tidemq.consumer.receive_calls import ReceiveCalls, heartbeat_loop, start_membership
from tidemq.consumer.receive_config import (
    PushConsumerConfig,
    invisible_ms,
    subscriptions_of,
)
from tidemq.consumer.renewal import Hold, Renewal, check_interval_ms, decide
from tidemq.errors import ClientClosedError, TidemqError
from tidemq.types import ConsumeResult, ReceivedMessage

__all__ = [
    "AsyncListener",
    "AsyncPushConsumer",
    "Listener",
    "PushStats",
    "consume_outcome",
]

log = logging.getLogger(__name__)


class AsyncPushConsumer:
    """Use as ``async with AsyncPushConsumer(group, "orders", listener) as c``, where
    ``listener`` is an ``async def`` taking a ``ReceivedMessage`` (a plain function works too,
    but runs on the event loop: use ``PushConsumer`` for blocking work)."""

    def __init__(
        self,
        group: str,
        subscriptions: Mapping[str, str] | str,
        listener: AsyncListener,
        *,
        nameserver: str | Sequence[str] | None = None,
        config: PushConsumerConfig | None = None,
    ) -> None:
        if not callable(listener):
            raise TypeError("listener must be callable")
        self.config = config or PushConsumerConfig()
        self.group = group
        self.subscriptions = subscriptions_of(subscriptions)
        self.client_id = self.config.client_id or default_client_id()
        self._listener = listener
        self._calls = ReceiveCalls.for_consumer(
            nameserver, group, self.subscriptions, self.client_id, self.config
        )
        self._invisible_ms = invisible_ms(self.config.invisible_duration_s)
        self.stats = PushStats()
        self.last_error: TidemqError | None = None
        self._holds: dict[int, tuple[ReceivedMessage, Hold]] = {}
        self._consuming: set[asyncio.Task[None]] = set()
        self._renewals: dict[int, asyncio.Task[None]] = {}
        self._slot_free: asyncio.Event | None = None
        # Received messages waiting for a free listener, in the order they came.
        self._buffer: collections.deque[tuple[ReceivedMessage, Hold]] = collections.deque()
        self._running = 0  # listeners started and not finished
        self._idle: asyncio.Event | None = None  # set while no listener runs
        # PushConsumer's blocking listener and its threads: no asyncio task per message.
        self._threads: ListenerThreads | None = None
        self._sync_listener: Listener | None = None
        self._gave_up = False  # close stopped waiting: late answers are dropped
        self._acks: AckBatcher | None = None
        self._receiving: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False
        self._tracing = consume_tracing(self.config.tracer_provider, group)

    async def start(self) -> AsyncPushConsumer:
        if self._closed:
            raise ClientClosedError("consumer closed", code="CLOSED")
        if self._started:
            return self
        await start_membership(self._calls)
        cfg = self.config
        self._slot_free = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._acks = AckBatcher(
            self._calls.ack, cfg.ack_batch_max_messages, cfg.ack_linger_ms, self._acked
        )
        self._background.append(
            asyncio.ensure_future(heartbeat_loop(self._calls, cfg.heartbeat_interval_ms))
        )
        if cfg.auto_renew:
            self._background.append(asyncio.ensure_future(self._renew_loop()))
        self._receiving = asyncio.ensure_future(self._receive_loop())
        self._started = True
        return self

    async def __aenter__(self) -> AsyncPushConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def running(self) -> int:
        """Listeners running now."""
        return self._running

    @property
    def buffered(self) -> int:
        """Messages received and waiting for a free listener."""
        return len(self._holds) - self._running

    # ------------------------------------------------------------------ receiving
    async def _receive_loop(self) -> None:
        cfg = self.config
        assert self._slot_free is not None
        failures = 0
        capacity = cfg.max_concurrency + cfg.buffer_messages
        # Receive again once half a batch fits, not at each finished listener: a receive for a
        # message or two costs the broker nearly what one for a batch does.
        refill_at = max(1, min(cfg.receive_batch_size, capacity) // 2)
        while True:
            self._slot_free.clear()
            free = capacity - len(self._holds)
            if free < refill_at:
                await self._slot_free.wait()
                continue
            sent_ms = monotonic_ms()
            try:
                messages = await self._calls.receive(
                    min(free, cfg.receive_batch_size), self._invisible_ms, cfg.long_poll_ms
                )
            except TidemqError as e:
                self.last_error = e
                failures += 1
                log.warning("receiving for %s failed: %s", self.group, e)
                await asyncio.sleep(_retry_wait_s(failures))
                continue
            except Exception:
                failures += 1
                log.exception("receiving for %s failed unexpectedly", self.group)
                await asyncio.sleep(_retry_wait_s(failures))
                continue
            failures = 0
            self.stats.receive_calls += 1
            self.stats.received += len(messages)
            for m in messages:
                self._start(m, sent_ms)

    def _start(self, message: ReceivedMessage, sent_ms: int) -> None:
        # Held (and renewed when needed) from receipt, whether it runs now or waits.
        hold = Hold(started_ms=monotonic_ms(), deadline_ms=sent_ms + self._invisible_ms)
        self._holds[id(message)] = (message, hold)
        if self._running < self.config.max_concurrency:
            self._launch(message, hold)
        else:
            self._buffer.append((message, hold))

    def _launch(self, message: ReceivedMessage, hold: Hold) -> None:
        self._running += 1
        assert self._idle is not None
        self._idle.clear()
        if self._threads is not None:
            listener = self._sync_listener
            assert listener is not None
            if self._tracing is not None:
                listener = self._tracing.wrap_listener(listener)
            self._threads.submit(
                listener, message, functools.partial(self._answered, message, hold)
            )
            return
        self._track(self._consume(message, hold))

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._consuming.add(task)
        task.add_done_callback(self._consuming.discard)

    def _answered(
        self, message: ReceivedMessage, hold: Hold, result: Any, error: BaseException | None
    ) -> None:
        """A blocking listener's answer, on the loop."""
        if self._gave_up:
            return
        if error is not None:
            log_listener_error(message, error)
            result = ConsumeResult.FAILURE
        outcome = consume_outcome(result)
        self._listened(message, hold)
        if outcome is ConsumeResult.SUCCESS and id(hold) not in self._renewals:
            self.stats.succeeded += 1
            assert self._acks is not None
            self._acks.add(message)
            return
        self._track(self._settle(message, hold, outcome))

    async def _consume(self, message: ReceivedMessage, hold: Hold) -> None:
        outcome = await self._listen(message, hold)
        await self._settle(message, hold, outcome)

    async def _settle(self, message: ReceivedMessage, hold: Hold, outcome: ConsumeResult) -> None:
        await self._settled_renewal(hold)
        if outcome is ConsumeResult.SUCCESS:
            self.stats.succeeded += 1
            assert self._acks is not None
            self._acks.add(message)
            return
        self.stats.failed += 1
        try:
            [error] = await self._calls.nack(
                message.topic, message.broker, [message.receipt_handle]
            )
        except TidemqError as e:
            error = e
        if error is None:
            self.stats.nacked += 1
        else:
            # The message comes back anyway when its invisibility ends.
            self.last_error = error
            log.warning("nack of %s failed: %s", message.msg_id, error)

    async def _listen(self, message: ReceivedMessage, hold: Hold) -> ConsumeResult:
        """Runs the listener; what its answer means. The next buffered message takes over
        the listener slot when it is done."""
        try:
            try:
                if self._tracing is None:
                    result = self._listener(message)
                    if inspect.isawaitable(result):
                        result = await result
                else:
                    with self._tracing.processing(message):
                        result = self._listener(message)
                        if inspect.isawaitable(result):
                            result = await result
            except Exception:
                log.exception(
                    "listener failed on %s (attempt %d)", message.msg_id, message.delivery_attempt
                )
                result = ConsumeResult.FAILURE
            return consume_outcome(result)
        finally:
            self._listened(message, hold)

    def _listened(self, message: ReceivedMessage, hold: Hold) -> None:
        """The listener is done with the message: its slot goes to the next buffered one."""
        self._running -= 1
        hold.released = True
        self._holds.pop(id(message), None)
        if self._buffer:
            self._launch(*self._buffer.popleft())
        elif self._running == 0:
            assert self._idle is not None
            self._idle.set()
        assert self._slot_free is not None
        self._slot_free.set()

    async def _settled_renewal(self, hold: Hold) -> None:
        # A renewal in flight replaces the handle; the ack must carry the new one.
        task = self._renewals.get(id(hold))
        if task is not None:
            await asyncio.wait([task])

    def _acked(self, message: ReceivedMessage, error: TidemqError | None) -> None:
        if error is None:
            self.stats.acked += 1
        else:
            self.stats.ack_errors += 1
            self.last_error = error
            log.warning("ack of %s failed: %s", message.msg_id, error)

    # ------------------------------------------------------------------ renewal
    async def _renew_loop(self) -> None:
        cfg = self.config
        interval_s = check_interval_ms(self._invisible_ms) / 1000
        while True:
            await asyncio.sleep(interval_s)
            now = monotonic_ms()
            for message, hold in list(self._holds.values()):
                decision = decide(hold, now, self._invisible_ms, cfg.consume_timeout_ms)
                if decision is Renewal.RENEW:
                    hold.renewing = True
                    self._renewals[id(hold)] = asyncio.ensure_future(self._renew(message, hold))
                elif decision is Renewal.GIVE_UP:
                    hold.released = True
                    log.warning(
                        "listener has run on %s for over %d ms: its invisibility is no longer"
                        " renewed and it will be delivered again",
                        message.msg_id,
                        cfg.consume_timeout_ms,
                    )

    async def _renew(self, message: ReceivedMessage, hold: Hold) -> None:
        sent_ms = monotonic_ms()
        try:
            await self._calls.change_invisible_duration(message, self._invisible_ms)
        except TidemqError as e:
            self.last_error = e
            log.warning("renewing the invisibility of %s failed: %s", message.msg_id, e)
            if not e.retriable:
                hold.released = True  # the hold is lost: the ack will fail, it comes back
        else:
            hold.deadline_ms = sent_ms + self._invisible_ms
            self.stats.renewed += 1
        finally:
            hold.renewing = False
            self._renewals.pop(id(hold), None)

    # ------------------------------------------------------------------ closing
    async def close(self) -> None:
        """Stops receiving, waits for running and buffered listeners (up to
        ``shutdown_timeout_ms``), sends
        the waiting acks, leaves the group."""
        if self._closed:
            return
        self._closed = True
        if self._receiving is not None:
            # A receive cut short here may have been granted messages: they come back to the
            # group when their invisible duration ends.
            await _cancel(self._receiving)
        # Buffered messages start as running ones finish: wait until none is left.
        deadline = monotonic_ms() + self.config.shutdown_timeout_ms
        while self._consuming or self._running:
            left_ms = deadline - monotonic_ms()
            if left_ms <= 0:
                break
            assert self._idle is not None
            idle = asyncio.ensure_future(self._idle.wait())
            await asyncio.wait(
                {*self._consuming, idle},
                timeout=left_ms / 1000,
                return_when=asyncio.FIRST_COMPLETED,
            )
            await _cancel(idle)
        if self._consuming or self._running:
            log.warning(
                "closing with %d listeners still running and %d messages buffered after %d ms;"
                " their messages will be delivered again",
                self._running,
                len(self._buffer),
                self.config.shutdown_timeout_ms,
            )
            for _, hold in self._buffer:
                hold.released = True
            self._buffer.clear()  # before the cancels: a finishing listener starts the next
            self._gave_up = True
            for task in list(self._consuming):
                await _cancel(task)
        if self._acks is not None:
            await self._acks.close()
        for task in [*self._background, *self._renewals.values()]:
            await _cancel(task)
        if self._started:
            await self._calls.unregister_all()
        await self._calls.close()


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _retry_wait_s(failures: int) -> float:
    """The waits of the SDK's retry policy (``_runtime.backoff``: 50 ms doubling to 1 s, plus
    up to 50 ms of jitter) after the n-th failure in a row."""
    return min(0.05 * 2.0 ** (failures - 1), 1.0) + random.uniform(0, 0.05)
