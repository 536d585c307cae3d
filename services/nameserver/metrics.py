"""The nameserver's Prometheus series beyond the refused calls and the process: what its registry
holds (live brokers by cluster and role, groups without a master, topics, whether the routes are
stale) read at scrape time, and how route queries ended.

The registry belongs to the event loop (the embedded table is changed there without a lock), so
a scrape, which runs in the HTTP server's thread, asks the loop for a snapshot and waits for it a
bounded time; a loop too busy to answer, or stopping, leaves the registry's series without
samples in that scrape rather than reading a table mid-change.

Label cardinality: ``cluster`` names registered clusters, ``role`` and ``outcome`` are enums.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from tidemq.services.nameserver.registry import Registry, RegistryUnavailableError
from tidemq.services.nameserver.route_model import MASTER_ID, BrokerRole, ClusterInfo
from tidemq.services.nameserver.servicer import ROUTE_QUERY_OUTCOMES

log = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Snapshot:
    clusters: list[ClusterInfo] | None  # None: the registry has no routes yet (ZooKeeper)
    topics: int | None
    stale: bool


class RegistryCollector:
    def __init__(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        self.registry = registry
        self.loop = loop

    def describe(self) -> Iterable[Metric]:
        return _families()

    async def _snapshot(self) -> Snapshot:
        status = await self.registry.status()
        try:
            clusters = await self.registry.cluster_info()
            topics = await self.registry.topic_count()
        except RegistryUnavailableError:
            return Snapshot(None, None, status.stale)
        return Snapshot(clusters, topics, status.stale)

    def collect(self) -> Iterable[Metric]:
        brokers, masterless, topics, stale = fams = _families()
        try:
            snap = asyncio.run_coroutine_threadsafe(self._snapshot(), self.loop).result(
                SNAPSHOT_TIMEOUT_S
            )
        except (RuntimeError, concurrent.futures.TimeoutError) as e:
            log.debug("metrics: registry snapshot unavailable (%s)", e)
            return fams  # named, without samples: nothing read is better than a torn read
        stale.add_metric([], 1 if snap.stale else 0)
        if snap.clusters is None or snap.topics is None:
            return fams
        for c in snap.clusters:
            by_role = dict.fromkeys(BrokerRole, 0)  # every role, 0 too: "no master" is a value
            for b in c.brokers:
                by_role[b.registration.role] += 1
            for role, n in by_role.items():
                brokers.add_metric([c.cluster, role.name], n)
            masterless.add_metric(
                [c.cluster], sum(1 for g in c.groups if MASTER_ID not in g.addresses)
            )
        topics.add_metric([], snap.topics)
        return fams


def _families() -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily(
            "tidemq_nameserver_brokers",
            "Live brokers registered with this nameserver, by cluster and registered role",
            labels=("cluster", "role"),
        ),
        GaugeMetricFamily(
            "tidemq_nameserver_groups_without_master",
            "Broker groups with live members but no registered master (id 0): writes to their "
            "queues fail until one registers",
            labels=("cluster",),
        ),
        GaugeMetricFamily(
            "tidemq_nameserver_topics",
            "Topics some live broker group serves, as this nameserver routes them",
        ),
        GaugeMetricFamily(
            "tidemq_nameserver_registry_stale",
            "1 while this nameserver's routes may be out of date (its ZooKeeper is out of "
            "reach); 0 for the embedded registry",
        ),
    ]


REGISTRATION_KINDS = ("full", "incremental", "full_needed")


class NameServerMetrics:
    """The route query counter and the registry collector, in the nameserver's registry."""

    def __init__(
        self, metrics: CollectorRegistry, registry: Registry, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.route_queries = Counter(
            "tidemq_nameserver_route_queries",
            "QueryRoute calls, by outcome: found, not_found (no group serves the topic), "
            "unavailable (the registry has not read its routes yet), invalid (a bad topic name)",
            ["outcome"],
            registry=metrics,
        )
        for outcome in ROUTE_QUERY_OUTCOMES:
            self.route_queries.labels(outcome)  # every outcome from 0: rates need a start
        self.registrations = Counter(
            "tidemq_nameserver_registrations",
            "RegisterBroker calls accepted, by kind: full (every topic of the broker) or "
            "incremental (what changed since the version this nameserver held); "
            "full_needed counts incremental ones answered with full_registration_needed",
            ["kind"],
            registry=metrics,
        )
        for kind in REGISTRATION_KINDS:
            self.registrations.labels(kind)
        metrics.register(RegistryCollector(registry, loop))

    def route_query(self, outcome: str) -> None:
        self.route_queries.labels(outcome).inc()

    def registration(self, kind: str) -> None:
        self.registrations.labels(kind).inc()
