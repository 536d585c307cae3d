"""Which queue a message goes to (RocketMQ's ``MQFaultStrategy``): round robin over the topic's
writable queues, skipping broker groups that just failed or answered slowly; or, with a
``sharding_key``, always the same queue for the same key. The producer places messages with it,
and the sender moves retried ones with it."""

from __future__ import annotations

import zlib

from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay

from tidemq._runtime import backoff, monotonic_ms
from tidemq.errors import RouteNotFoundError, is_retriable
from tidemq.fault import FaultToleranceConfig, LatencyFaultTolerance
from tidemq.producer.blocks import Block
from tidemq.producer.config import ProducerConfig
from tidemq.producer.pending import Pending
from tidemq.routes import MessageQueue, RouteCache, TopicRoute


class QueueSelector:
    """Picks queues from a topic's route; ``fault`` is where the sender reports each broker
    group's failures and latencies."""

    def __init__(self, routes: RouteCache, config: ProducerConfig) -> None:
        self.routes = routes
        self.config = config
        self.fault = LatencyFaultTolerance(
            FaultToleranceConfig(failure_isolation_ms=config.failure_isolation_ms)
        )
        self._round_robin: dict[str, int] = {}

    async def route(self, topic: str) -> TopicRoute:
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

    def select(
        self, route: TopicRoute, p: Pending | Block, avoid: frozenset[str] = frozenset()
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
            if q.broker_name not in avoid and self.fault.is_available(q.broker_name, now):
                return q
        # Every group is avoided or isolated: try the one that should recover first.
        candidates = {q.broker_name for q in queues} - avoid or {q.broker_name for q in queues}
        best = self.fault.pick_least_bad(sorted(candidates))
        for i in range(n):
            q = queues[(start + i) % n]
            if q.broker_name == best:
                return q
        return queues[start % n]
