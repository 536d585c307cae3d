"""``SimpleConsumer`` and ``AsyncSimpleConsumer`` (RocketMQ 5's SimpleConsumer): the
application receives messages and settles each one itself.

Each received message is invisible to the group's other members for the invisible duration the
receive asked for, and carries a receipt handle and its delivery attempt (1 the first time).
``ack`` completes it; ``nack`` gives it back for a retry after the group's backoff;
``change_invisible_duration`` extends or shortens its invisibility from now (the message gets a
new handle in place); ``dead_letter`` moves it to the group's dead-letter queue at once. A
message not acked within its invisible time is delivered again, its attempt incremented.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence

from tidemq._runtime import LoopThread
from tidemq.consumer.config import default_client_id
from tidemq.consumer.consume_tracing import consume_tracing
from tidemq.consumer.receive_calls import ReceiveCalls, heartbeat_loop, start_membership
from tidemq.consumer.receive_config import (
    SimpleConsumerConfig,
    invisible_ms,
    subscriptions_of,
)
from tidemq.consumer.settling import check_handle, settle_many
from tidemq.errors import ClientClosedError, InvalidArgumentError, TidemqError
from tidemq.types import ReceivedMessage


class AsyncSimpleConsumer:
    """Use as ``async with AsyncSimpleConsumer(group, "orders", nameserver=...) as c``."""

    def __init__(
        self,
        group: str,
        subscriptions: Mapping[str, str] | str,
        *,
        nameserver: str | Sequence[str] | None = None,
        config: SimpleConsumerConfig | None = None,
    ) -> None:
        self.config = config or SimpleConsumerConfig()
        self.group = group
        self.subscriptions = subscriptions_of(subscriptions)
        self.client_id = self.config.client_id or default_client_id()
        self._calls = ReceiveCalls.for_consumer(
            nameserver, group, self.subscriptions, self.client_id, self.config
        )
        self._heartbeats: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._tracing = consume_tracing(self.config.tracer_provider, group)

    async def start(self) -> AsyncSimpleConsumer:
        """Announces the member to the brokers (model RECEIVE); a group that consumes by
        offsets raises ``ConsumeModelMismatch`` here."""
        if self._started:
            return self
        await start_membership(self._calls)
        self._heartbeats = asyncio.ensure_future(
            heartbeat_loop(self._calls, self.config.heartbeat_interval_ms)
        )
        self._started = True
        return self

    async def __aenter__(self) -> AsyncSimpleConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration_s: float = 30.0,
        *,
        timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages``, waiting up to ``timeout_s`` (default ``long_poll_ms``) for
        some; [] when none came."""
        self._check_open()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidArgumentError(
                f"max_messages must be an int >= 1, not {max_messages!r}", code="INVALID_ARGUMENT"
            )
        duration_ms = invisible_ms(invisible_duration_s)
        if timeout_s is None:
            wait_ms = self.config.long_poll_ms
        elif timeout_s >= 0:
            wait_ms = round(timeout_s * 1000)
        else:
            raise InvalidArgumentError("timeout_s must be >= 0", code="INVALID_ARGUMENT")
        messages = await self._calls.receive(max_messages, duration_ms, wait_ms)
        if messages and self._tracing is not None:
            self._tracing.received(messages)
        return messages

    async def ack(self, message: ReceivedMessage) -> None:
        """Completes the message. ``ReceiptHandleExpired`` when its invisibility ended first
        (it will be, or was, delivered again); ``MessageAlreadyAcked`` when acked before (also
        by another member, when a retried ack arrives after the handle expired)."""
        [error] = await self.ack_many([message])
        if error is not None:
            raise error

    async def ack_many(self, messages: Iterable[ReceivedMessage]) -> list[TidemqError | None]:
        """Acks many at once (one call per broker group and topic); for each message None, or
        the error its ack got (its own, or its call's when that failed as a whole)."""
        self._check_open()
        settled = list(messages)
        if self._tracing is None:
            return await settle_many(self._calls.ack, settled)
        with self._tracing.acking(settled) as span:
            errors = await settle_many(self._calls.ack, settled)
            self._tracing.settled(span, errors)
        return errors

    async def nack(self, message: ReceivedMessage) -> None:
        """Gives the message back: delivered again after the group's backoff for its attempt,
        or moved to the dead-letter queue when its attempts are used up."""
        self._check_open()
        check_handle(message)
        [error] = await self._calls.nack(message.topic, message.broker, [message.receipt_handle])
        if error is not None:
            raise error

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> None:
        """Invisible for ``seconds`` from now (longer or shorter than before). The message's
        ``receipt_handle`` and ``invisible_until_ms`` are replaced in place: the old handle
        stops working."""
        self._check_open()
        check_handle(message)
        await self._calls.change_invisible_duration(message, invisible_ms(seconds))

    async def dead_letter(self, message: ReceivedMessage, reason: str = "") -> None:
        """Moves the message to the group's dead-letter queue (``%DLQ%<group>``) at once."""
        self._check_open()
        check_handle(message)
        await self._calls.dead_letter(message, reason)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeats
        if self._started:
            await self._calls.unregister_all()
        await self._calls.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("consumer closed", code="CLOSED")
        if not self._started:
            raise ClientClosedError(
                "consumer not started: use 'async with' or await start()", code="NOT_STARTED"
            )


class SimpleConsumer:
    """The blocking SimpleConsumer: every method of ``AsyncSimpleConsumer``, waiting for the
    answer (it runs one on a private event loop thread)::

        with tidemq.SimpleConsumer("billing", "orders") as consumer:
            for m in consumer.receive(max_messages=16, invisible_duration_s=30):
                handle(m)
                consumer.ack(m)
    """

    def __init__(
        self,
        group: str,
        subscriptions: Mapping[str, str] | str,
        *,
        nameserver: str | Sequence[str] | None = None,
        config: SimpleConsumerConfig | None = None,
    ) -> None:
        self._runner = LoopThread("tidemq-simple-consumer")
        try:
            self._core = self._runner.run(self._make(group, subscriptions, nameserver, config))
        except BaseException:
            self._runner.stop()
            raise
        self.config = self._core.config
        self.group = group
        self.client_id = self._core.client_id

    @staticmethod
    async def _make(
        group: str,
        subscriptions: Mapping[str, str] | str,
        nameserver: str | Sequence[str] | None,
        config: SimpleConsumerConfig | None,
    ) -> AsyncSimpleConsumer:
        # Built on the runner's loop: its asyncio primitives belong to that loop.
        core = AsyncSimpleConsumer(group, subscriptions, nameserver=nameserver, config=config)
        try:
            return await core.start()
        except BaseException:
            await core.close()
            raise

    def start(self) -> SimpleConsumer:
        """The constructor has started it already (as ``Consumer``); for code written against
        RocketMQ's clients and the asyncio version, which start explicitly."""
        return self

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive(
        self,
        max_messages: int = 16,
        invisible_duration_s: float = 30.0,
        *,
        timeout_s: float | None = None,
    ) -> list[ReceivedMessage]:
        return self._runner.run(
            self._core.receive(max_messages, invisible_duration_s, timeout_s=timeout_s)
        )

    def ack(self, message: ReceivedMessage) -> None:
        self._runner.run(self._core.ack(message))

    def ack_many(self, messages: Iterable[ReceivedMessage]) -> list[TidemqError | None]:
        return self._runner.run(self._core.ack_many(list(messages)))

    def nack(self, message: ReceivedMessage) -> None:
        self._runner.run(self._core.nack(message))

    def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> None:
        self._runner.run(self._core.change_invisible_duration(message, seconds))

    def dead_letter(self, message: ReceivedMessage, reason: str = "") -> None:
        self._runner.run(self._core.dead_letter(message, reason))

    def close(self) -> None:
        self._runner.finish(self._core.close)
