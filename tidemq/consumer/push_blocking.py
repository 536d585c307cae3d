"""``PushConsumer``: the blocking push consumer. Its listener is a plain function run on
``max_concurrency`` threads (``listener_threads``); everything else is ``AsyncPushConsumer``
on a private event loop thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidemq._runtime import LoopThread
from tidemq.consumer.listener_threads import ListenerThreads
from tidemq.consumer.push import AsyncPushConsumer, Listener, PushStats
from tidemq.consumer.receive_config import PushConsumerConfig
from tidemq.errors import TidemqError


class PushConsumer:
    """The blocking PushConsumer: ``listener`` is a plain function, run on a pool of
    ``max_concurrency`` threads::

        def handle(message: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
            ...
            return tidemq.ConsumeResult.SUCCESS

        with tidemq.PushConsumer("billing", "orders", handle):
            wait_for_shutdown()
    """

    def __init__(
        self,
        group: str,
        subscriptions: Mapping[str, str] | str,
        listener: Listener,
        *,
        nameserver: str | Sequence[str] | None = None,
        config: PushConsumerConfig | None = None,
    ) -> None:
        if not callable(listener):
            raise TypeError("listener must be callable")
        config = config or PushConsumerConfig()
        self._threads = ListenerThreads(config.max_concurrency)
        self._runner = LoopThread("tidemq-push-consumer")

        try:
            self._core = self._runner.run(
                self._make(group, subscriptions, listener, self._threads, nameserver, config)
            )
        except BaseException:
            self._runner.stop()
            self._threads.stop()
            raise
        self.config = self._core.config
        self.group = group
        self.client_id = self._core.client_id

    @staticmethod
    async def _make(
        group: str,
        subscriptions: Mapping[str, str] | str,
        listener: Listener,
        threads: ListenerThreads,
        nameserver: str | Sequence[str] | None,
        config: PushConsumerConfig,
    ) -> AsyncPushConsumer:
        core = AsyncPushConsumer(
            group, subscriptions, listener, nameserver=nameserver, config=config
        )
        # The listener runs on the threads, its answers handled on the loop: no task each.
        core._threads, core._sync_listener = threads, listener
        try:
            return await core.start()
        except BaseException:
            await core.close()
            raise

    def start(self) -> PushConsumer:
        """The constructor has started it already (as ``Consumer``); for code written against
        RocketMQ's clients and the asyncio version, which start explicitly."""
        return self

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> PushStats:
        return self._core.stats

    @property
    def last_error(self) -> TidemqError | None:
        return self._core.last_error

    @property
    def running(self) -> int:
        """Listeners running now."""
        return self._core.running

    @property
    def buffered(self) -> int:
        """Messages received and waiting for a free listener."""
        return self._core.buffered

    def close(self) -> None:
        try:
            self._runner.finish(self._core.close)
        finally:
            # Listeners still running after shutdown_timeout_ms are left to finish on their own.
            self._threads.stop()
