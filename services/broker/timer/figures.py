"""The timer's metrics: pending timers (read at each scrape), lateness of each delivery (from
its due time to its store time), deliveries and recalls."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENESS_BUCKETS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class TimerMetrics:
    """``TimerCounters`` for the service, registered in the broker's registry."""

    def __init__(self, registry: CollectorRegistry, pending: Callable[[], int]) -> None:
        self.lateness = Histogram(
            "tidemq_timer_lateness_seconds",
            "Delayed messages delivered: from their delivery time to when the master stored "
            "them in their topic",
            buckets=LATENESS_BUCKETS_S,
            registry=registry,
        )
        self.delivered_total = Counter(
            "tidemq_timer_delivered",
            "Delayed messages delivered to their topics",
            registry=registry,
        )
        self.recalled_total = Counter(
            "tidemq_timer_recalled",
            "Delayed messages recalled before their delivery time",
            registry=registry,
        )
        registry.register(_PendingCollector(pending))

    def delivered(self, lateness_ms: Sequence[int]) -> None:
        for ms in lateness_ms:
            self.lateness.observe(ms / 1000)
        self.delivered_total.inc(len(lateness_ms))

    def recalled(self) -> None:
        self.recalled_total.inc()


class _PendingCollector(Collector):
    def __init__(self, pending: Callable[[], int]) -> None:
        self.pending = pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "tidemq_timer_pending",
            "Delayed messages waiting for their delivery time on this master (its timer wheel)",
            value=self.pending(),
        )
