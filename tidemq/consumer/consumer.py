"""The consumer's API: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking, runs an
AsyncConsumer on a background loop). It owns the queues membership assigns it (a pull task
each), hands out what they pulled in ``poll``, and commits as the package docstring
(``tidemq.consumer``) describes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from tidemq._runtime import Channels, LoopThread, nameserver_addresses
from tidemq.consumer.brokers import Brokers
from tidemq.consumer.config import ConsumerConfig, default_client_id
from tidemq.consumer.consume_tracing import consume_tracing
from tidemq.consumer.membership import Membership
from tidemq.consumer.offsets import Offsets
from tidemq.consumer.pulling import Puller, QueueState
from tidemq.errors import ClientClosedError, TidemqError
from tidemq.routes import MessageQueue, NameServerClient, RouteCache
from tidemq.types import ReceivedMessage

log = logging.getLogger(__name__)


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
        # Tracing (``consume_tracing``): an OpenTelemetry TracerProvider, else the global one.
        self._tracing = consume_tracing(settings.pop("tracer_provider", None), group)
        self.config = ConsumerConfig(**settings)
        self.client_id = self.config.client_id or default_client_id()
        self._channels = Channels(self.config.tls, self.config.credentials)
        self._nameserver = NameServerClient(nameserver_addresses(nameserver), self._channels)
        self.routes = RouteCache(self._nameserver, self.config.route_refresh_ms / 1000)
        self._owned: dict[MessageQueue, QueueState] = {}
        self._data = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_lock = asyncio.Lock()
        self._take_from = 0
        self._started = False
        self._closed = False
        self.last_error: TidemqError | None = None
        brokers = Brokers(self._channels, self.routes, self.config.master_retry_ms, self._report)
        self._membership = Membership(self.client_id, group, self.topics, self.config, brokers)
        self._offsets = Offsets(group, self.config, brokers, self._report)
        self._puller = Puller(group, self.config, brokers, self._data, self._report)

    def _report(self, error: TidemqError) -> None:
        self.last_error = error

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> AsyncConsumer:
        if self._started:
            return self
        self._started = True
        await self._membership.heartbeat_all()
        await self.rebalance()
        cfg = self.config
        self._tasks = [
            asyncio.ensure_future(
                self._every(cfg.heartbeat_interval_ms, self._membership.heartbeat_all)
            ),
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
            await asyncio.gather(*(self._puller.stop(st) for st in states))
            if self.config.auto_commit:
                for st in states:
                    st.processed = st.delivered
                await self._offsets.commit(states, use_processed=True)
            self._owned.clear()
        await self._membership.unregister_all()
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
                if got and self._tracing is not None:
                    self._tracing.received(got)
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
        if out and self.config.metrics is not None:
            self.config.metrics.received_messages(self.group, out)
        return out

    # ------------------------------------------------------------------ offsets
    async def commit(self) -> None:
        """Commits the position after every message ``poll`` has returned so far."""
        async with self._rebalance_lock:
            await self._offsets.commit(list(self._owned.values()), use_processed=False)

    async def _commit_processed(self) -> None:
        async with self._rebalance_lock:
            await self._offsets.commit(list(self._owned.values()), use_processed=True)

    # ------------------------------------------------------------------ rebalancing
    async def rebalance(self) -> None:
        """Re-reads routes and membership and moves queues; runs periodically by itself."""
        async with self._rebalance_lock:
            if self._closed:
                return
            wanted = await self._membership.wanted()
            revoked = [st for mq, st in self._owned.items() if mq not in wanted]
            if revoked:
                log.info("consumer %s releases %s", self.client_id, [str(s.mq) for s in revoked])
                await asyncio.gather(*(self._puller.stop(st) for st in revoked))
                if self.config.auto_commit:
                    # Without auto-commit only the application says what is handled; the new
                    # owner starts at its last commit (at-least-once).
                    await self._offsets.commit(revoked, use_processed=True)
                for st in revoked:
                    del self._owned[st.mq]
            for mq in sorted(wanted - set(self._owned)):
                try:
                    offset = await self._offsets.initial(mq)
                except TidemqError as e:
                    self.last_error = e
                    log.warning("cannot start %s yet: %s", mq, e)
                    continue
                self._owned[mq] = self._puller.start(mq, offset)
                log.info("consumer %s reads %s from offset %d", self.client_id, mq, offset)


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
