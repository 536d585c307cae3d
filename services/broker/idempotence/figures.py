"""Prometheus figures of idempotent sends, read from the send path's counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.services.broker.idempotence.sends import IdempotentSends


class IdempotenceCollector:
    def __init__(self, sends: IdempotentSends) -> None:
        self.sends = sends

    def collect(self) -> Iterable[Metric]:
        s = self.sends
        yield GaugeMetricFamily(
            "tidemq_idempotent_producers",
            "Idempotent producers whose sequences this broker remembers",
            value=len(s.table),
        )
        yield GaugeMetricFamily(
            "tidemq_idempotent_sends_waiting",
            "Idempotent sends waiting for an earlier send of their producer and queue that they "
            "overtook inside the broker",
            value=s.waiting_behind_gaps,
        )
        for name, doc, value in (
            (
                "tidemq_idempotent_duplicates",
                "Idempotent messages answered with their first store's result, not stored again",
                s.duplicates,
            ),
            (
                "tidemq_idempotent_sequence_gaps",
                "Idempotent sends refused with SEQUENCE_GAP",
                s.gaps,
            ),
            ("tidemq_idempotent_fenced", "Idempotent sends refused with PRODUCER_FENCED", s.fenced),
            (
                "tidemq_idempotent_producers_evicted",
                "Producers dropped from the idempotence table (least recently used)",
                s.table.evicted,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
