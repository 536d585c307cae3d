"""Transactions as Prometheus metrics, read at scrape time from the service's figures:
``tidemq_transactions_open`` (gauge, on the master), ``tidemq_transaction_checks_total`` and
``tidemq_transactions_resolved_total{resolution, by}`` (counters since the broker started)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.services.broker.transactions.service import TransactionService

_OPEN = ("tidemq_transactions_open", "Transactions whose half message is not yet resolved")
_CHECKS = ("tidemq_transaction_checks", "Checks of open transactions sent to producers")
_RESOLVED = (
    "tidemq_transactions_resolved",
    "Transactions committed or rolled back, by the producer or by the checker",
)


class TransactionCollector:
    def __init__(self, service: Callable[[], TransactionService | None]) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily(*_OPEN),
            CounterMetricFamily(*_CHECKS),
            CounterMetricFamily(*_RESOLVED, labels=["resolution", "by"]),
        ]

    def collect(self) -> Iterable[Metric]:
        service = self.service()
        if service is None:
            return []
        resolved = CounterMetricFamily(*_RESOLVED, labels=["resolution", "by"])
        for (resolution, by), n in sorted(dict(service.resolved).items()):
            resolved.add_metric([resolution, by], n)
        out: list[Metric] = [CounterMetricFamily(*_CHECKS, value=service.checks_sent), resolved]
        if service.role.is_master:
            # A slave holds the same open transactions: counted once per group, by its master.
            out.append(GaugeMetricFamily(*_OPEN, value=len(service.log.state)))
        return out
