"""Prometheus metrics of the SDK's producers and consumers, for an application to expose.

Opt-in: build one ``ClientMetrics`` for the process and give it to each client as its
``metrics`` setting (``Producer(..., metrics=m)``, ``Consumer(..., metrics=m)``,
``SimpleConsumerConfig(metrics=m)``, ``PushConsumerConfig(metrics=m)``); without it (the
default) a client keeps no metrics and pays nothing for them. The series go to the registry
given, or to prometheus_client's default registry, the one ``start_http_server`` serves.
One ``ClientMetrics`` per registry: a second would register the same names again.

Counting is per request, not per message: the producer counts a record block or a request's
messages with one increment per topic (docs/sdk.md, "Metrics").

The SDK's own modules import this one for its constants only; prometheus_client is loaded when
a ``ClientMetrics`` is built.

Label cardinality: ``topic`` and ``group`` are what the application sends to and consumes as,
``outcome`` is a short fixed set. Nothing is labelled per message, queue or broker.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tidemq.types import ReceivedMessage, SendStatus

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# What a message's send ended as: stored (the SendStatus, lower case: "ok" for SEND_OK; the
# others are stored but not yet as durable as the broker asks) or failed.
SEND_OUTCOMES = {
    SendStatus.SEND_OK: "ok",
    SendStatus.FLUSH_DISK_TIMEOUT: "flush_disk_timeout",
    SendStatus.FLUSH_SLAVE_TIMEOUT: "flush_slave_timeout",
    SendStatus.SLAVE_NOT_AVAILABLE: "slave_not_available",
}
FAILED = "failed"

# From a send answered within a millisecond on loopback to one retried through a failover.
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
    30.0,
)


class ClientMetrics:
    """The SDK's series in ``registry`` (default: prometheus_client's ``REGISTRY``).

    Thread-safe, as prometheus_client's metrics are: several producers and consumers, each on
    its own event loop thread, may share one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # Imported here: an application without metrics never loads prometheus_client.
        from prometheus_client import REGISTRY, Counter, Histogram  # noqa: PLC0415

        r = REGISTRY if registry is None else registry
        self.registry = r
        self.sends = Counter(
            "tidemq_client_sends",
            "Messages whose send was answered, by topic and outcome: ok, flush_disk_timeout, "
            "flush_slave_timeout, slave_not_available (stored, not yet as durable as asked) "
            "or failed (not stored: the error was raised to the application)",
            ["topic", "outcome"],
            registry=r,
        )
        self.send_retries = Counter(
            "tidemq_client_send_retries",
            "Messages sent again after a retriable failure (one per message per retry)",
            ["topic"],
            registry=r,
        )
        self.send_latency = Histogram(
            "tidemq_client_send_latency_seconds",
            "Time from a send call to its answer, retries included, observed once per "
            "successful request (record block or batch) for its oldest message",
            ["topic"],
            buckets=SEND_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.received = Counter(
            "tidemq_client_received_messages",
            "Messages handed to the application (Consumer.poll, SimpleConsumer.receive, a "
            "PushConsumer's listener), by topic and consumer group",
            ["topic", "group"],
            registry=r,
        )
        self.acks = Counter(
            "tidemq_client_acks",
            "Acks of received messages (SimpleConsumer, PushConsumer), by outcome: ok, or "
            "failed (refused, e.g. the receipt handle expired: the message comes again)",
            ["topic", "group", "outcome"],
            registry=r,
        )
        self.nacks = Counter(
            "tidemq_client_nacks",
            "Received messages given back for redelivery (nack; a PushConsumer's listener "
            "failed), by outcome: ok or failed",
            ["topic", "group", "outcome"],
            registry=r,
        )
        self.offset_commits = Counter(
            "tidemq_client_offset_commits",
            "Queue offsets a Consumer committed to a broker, by outcome: ok, or failed "
            "(retried with the next commit)",
            ["topic", "group", "outcome"],
            registry=r,
        )

    # ------------------------------------------------------------------ producer
    def sent(self, topic: str, outcome: str, messages: int) -> None:
        self.sends.labels(topic, outcome).inc(messages)

    def sent_latency(self, topic: str, seconds: float) -> None:
        self.send_latency.labels(topic).observe(seconds)

    def retried(self, topic: str, messages: int) -> None:
        self.send_retries.labels(topic).inc(messages)

    # ------------------------------------------------------------------ consumers
    def received_messages(self, group: str, messages: Iterable[ReceivedMessage]) -> None:
        """One poll's messages, of any topics: one increment per topic."""
        for topic, n in Tally(m.topic for m in messages).items():
            self.received.labels(topic, group).inc(n)

    def received_from(self, topic: str, group: str, messages: int) -> None:
        if messages:
            self.received.labels(topic, group).inc(messages)

    def settled(
        self, kind: str, topic: str, group: str, errors: Sequence[BaseException | None]
    ) -> None:
        """One ack (``kind`` "ack") or nack call's results, one per message (None: done)."""
        counter = self.acks if kind == "ack" else self.nacks
        failed = sum(1 for e in errors if e is not None)
        if len(errors) > failed:
            counter.labels(topic, group, "ok").inc(len(errors) - failed)
        if failed:
            counter.labels(topic, group, FAILED).inc(failed)

    def committed(self, topic: str, group: str, ok: bool) -> None:
        self.offset_commits.labels(topic, group, "ok" if ok else FAILED).inc()
