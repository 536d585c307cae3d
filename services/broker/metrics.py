"""The broker's Prometheus metrics and the HTTP server that exposes them at ``/metrics``.

Request counters are updated by the handlers as calls finish; store, topic, client and queue
gauges are read from the live state at scrape time (``metrics_state``), so a scrape always shows
the present and no timer has to refresh them. Everything lives in one dedicated registry: two
brokers in one process (tests) never share series, and nothing global leaks in.

Label cardinality: ``topic`` labels only name topics that exist on this broker (a call about an
unknown topic fails before it is counted by topic), ``code`` and ``status`` are enum names, and
``group`` labels come from committed offsets. Per-queue consumer series
(``tidemq_consumer_offset``, ``tidemq_consumer_queue_lag_messages``) are bounded by committed
(group, topic) pairs times the topic's queues, and name only queues of existing topics.
Nothing is labelled per message or per client.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.failover import FailoverAgent
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.metrics_archive import ArchiveCollector
from tidemq.services.broker.metrics_failover import FailoverCollector
from tidemq.services.broker.metrics_state import RetentionCollector, StateCollector
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.metrics_endpoint import MetricsEndpoint, auth_refusals_counter
from tidemq.storage import Message, MessageStore

log = logging.getLogger(__name__)

# From a sub-millisecond async append to a SYNC flush that waits for the disk.
SEND_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class BrokerMetrics:
    """Every metric of one broker, in its own registry."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicManager,
        clients: ClientRegistry,
        offsets: OffsetManager,
        groups: SubscriptionGroupManager,
        replication_status: Callable[[], Any],
        role: RoleState,
        failover: FailoverAgent | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpc_requests = Counter(
            "tidemq_rpc_requests",
            "Broker RPCs answered, by method and outcome (OK or the ErrorCode name)",
            ["method", "code"],
            registry=r,
        )
        self.auth_refusals = auth_refusals_counter(r)
        self.send_messages = Counter(
            "tidemq_send_messages",
            "Messages stored by SendMessage, by topic and SendStatus",
            ["topic", "status"],
            registry=r,
        )
        self.send_bytes = Counter(
            "tidemq_send_bytes",
            "Body bytes of messages stored by SendMessage, by topic",
            ["topic"],
            registry=r,
        )
        self.send_latency = Histogram(
            "tidemq_send_latency_seconds",
            "Time from a SendMessage call's arrival to its answer (durable under SYNC flush), "
            "successful calls only",
            buckets=SEND_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.pull_requests = Counter(
            "tidemq_pull_requests",
            "PullMessage calls answered, by topic and PullStatus",
            ["topic", "status"],
            registry=r,
        )
        self.pull_messages = Counter(
            "tidemq_pull_messages",
            "Messages returned by PullMessage, by topic",
            ["topic"],
            registry=r,
        )
        self.pull_bytes = Counter(
            "tidemq_pull_bytes",
            "Record bytes returned by PullMessage, by topic",
            ["topic"],
            registry=r,
        )
        self.long_poll_waits = Counter(
            "tidemq_pull_long_poll_waits",
            "Times a pull at the head of its queue suspended to wait for new messages",
            registry=r,
        )
        self.long_poll_waiting = Gauge(
            "tidemq_pull_long_poll_waiting",
            "Pulls suspended in a long-poll wait right now",
            registry=r,
        )
        self.receive_acks = Counter(
            "tidemq_receive_acks",
            "Messages acked by receive groups, by group",
            ["group"],
            registry=r,
        )
        self.receive_redeliveries = Counter(
            "tidemq_receive_redeliveries",
            "Messages received again (delivery attempt > 1), by group",
            ["group"],
            registry=r,
        )
        self.receive_messages = Counter(
            "tidemq_receive_messages",
            "Messages delivered by ReceiveMessage, by group",
            ["group"],
            registry=r,
        )
        self.dead_letters = Counter(
            "tidemq_dead_letters",
            "Messages moved to their group's dead-letter queue, by group",
            ["group"],
            registry=r,
        )
        self.receive_short_durability = Counter(
            "tidemq_receive_short_durability",
            "Receive/ack records answered before they were as durable as a SEND_OK (the "
            "failover window for acks), by the put status",
            ["status"],
            registry=r,
        )
        r.register(
            StateCollector(config, store, topics, clients, offsets, groups, replication_status)
        )
        r.register(RetentionCollector(store))
        r.register(ArchiveCollector(store))
        r.register(FailoverCollector(role, failover))
        # The standard process_* series (CPU, memory, open files), as every exporter has them.
        ProcessCollector(registry=r)
        self.endpoint = MetricsEndpoint(r)

    # ------------------------------------------------------------------ servicer hooks
    def auth_refused(self, method: str, reason: str) -> None:
        self.auth_refusals.labels(method, reason).inc()

    def rpc(self, method: str, code: str) -> None:
        self.rpc_requests.labels(method, code).inc()

    def sent(self, messages: Sequence[Message], status: str, started_s: float) -> None:
        """A SendMessage whose messages were all stored with ``status``."""
        counts: Tally[str] = Tally()
        sizes: Tally[str] = Tally()
        # One labelled increment per topic, not per message: a batch can hold a thousand.
        for m in messages:
            counts[m.topic] += 1
            sizes[m.topic] += len(m.body)
        for topic, n in counts.items():
            self.send_messages.labels(topic, status).inc(n)
            self.send_bytes.labels(topic).inc(sizes[topic])
        self.send_latency.observe(time.monotonic() - started_s)

    def sent_blocks(
        self, topic: str, messages: int, body_bytes: int, status: str, started_s: float
    ) -> None:
        """A SendMessage of record blocks of ``topic`` (``messages`` stored with ``status``)."""
        if messages:
            self.send_messages.labels(topic, status).inc(messages)
            self.send_bytes.labels(topic).inc(body_bytes)
        self.send_latency.observe(time.monotonic() - started_s)

    def pulled(self, topic: str, status: str, messages: int, size_bytes: int) -> None:
        self.pull_requests.labels(topic, status).inc()
        if messages:
            self.pull_messages.labels(topic).inc(messages)
            self.pull_bytes.labels(topic).inc(size_bytes)

    def received(self, group: str, messages: int, redeliveries: int) -> None:
        self.receive_messages.labels(group).inc(messages)
        if redeliveries:
            self.receive_redeliveries.labels(group).inc(redeliveries)

    def acked(self, group: str, messages: int) -> None:
        self.receive_acks.labels(group).inc(messages)

    def dead_lettered(self, group: str, messages: int) -> None:
        self.dead_letters.labels(group).inc(messages)

    def short_durability(self, status: str) -> None:
        self.receive_short_durability.labels(status).inc()

    @contextlib.contextmanager
    def long_poll(self) -> Iterator[None]:
        self.long_poll_waits.inc()
        with self.long_poll_waiting.track_inprogress():
            yield

    # ------------------------------------------------------------------ HTTP endpoint
    def serve(self, listen: str) -> int:
        """Expose ``/metrics`` on ``listen`` (HOST:PORT) in a daemon thread; the bound port."""
        return self.endpoint.serve(listen)

    def stop(self) -> None:
        self.endpoint.stop()
