"""Receive groups' in-flight figures as Prometheus gauges, read at scrape time:
``tidemq_receive_inflight`` and ``tidemq_receive_retrying``, by group and topic.

The scrape runs in the metrics server's thread while the event loop applies events: a queue's
entries may change under the count, which then raises RuntimeError (a dict changed size). Such
a queue is counted again, and skipped for this scrape if it keeps changing: a figure one scrape
old is better than a scrape that fails."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.storage.clock import now_ms

_TRIES = 3
_INFLIGHT = ("tidemq_receive_inflight", "Messages invisible now, held by a receive group's member")
_RETRYING = (
    "tidemq_receive_retrying",
    "Messages of a receive group waiting for their retry (or visible again, not yet received)",
)


class ReceiveCollector:
    def __init__(
        self, states: Callable[[], ReceiveStates], groups: SubscriptionGroupManager
    ) -> None:
        self.states = states
        self.groups = groups

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily(n, d, labels=["group", "topic"]) for n, d in (_INFLIGHT, _RETRYING)
        ]

    def collect(self) -> Iterable[Metric]:
        inflight: Tally[tuple[str, str]] = Tally()
        retrying: Tally[tuple[str, str]] = Tally()
        now = now_ms()
        default = RetryPolicy()
        for key, q in self.states():
            g = self.groups.get(key.group)
            policy = g.settings.retry_policy if g is not None else default
            for _ in range(_TRIES):
                try:
                    held, waiting, _blocked = q.counts(now, policy)
                except RuntimeError:
                    continue
                inflight[key.group, key.topic] += held
                retrying[key.group, key.topic] += waiting
                break
        out = []
        for (name, doc), tally in ((_INFLIGHT, inflight), (_RETRYING, retrying)):
            fam = GaugeMetricFamily(name, doc, labels=["group", "topic"])
            for (group, topic), n in sorted(tally.items()):
                fam.add_metric([group, topic], n)
            out.append(fam)
        return out
