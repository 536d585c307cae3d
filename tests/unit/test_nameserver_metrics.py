"""The nameserver's registry series and route query outcomes without sockets: an embedded
registry on an event loop in a thread (as the server runs it), scraped from the test's thread
(as the HTTP server's thread scrapes it), and the servicer's QueryRoute called directly."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from tidemq.services.errors import ServiceError
from tidemq.services.nameserver.metrics import NameServerMetrics
from tidemq.services.nameserver.registry import EmbeddedRegistry, RegistryUnavailableError
from tidemq.services.nameserver.route_model import BrokerRegistration, BrokerRole, TopicQueues
from tidemq.services.nameserver.servicer import NameServerServicer

pytestmark = pytest.mark.unit


def reg(
    address: str, broker_id: int, name: str, cluster: str = "c1", topics: tuple[str, ...] = ()
) -> BrokerRegistration:
    return BrokerRegistration(
        cluster=cluster,
        broker_name=name,
        broker_id=broker_id,
        address=address,
        ha_address="",
        role=BrokerRole.SYNC_MASTER if broker_id == 0 else BrokerRole.SLAVE,
        epoch=0,
        topics=tuple(TopicQueues(t, 4, 4, 6) for t in topics),
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def on(loop: asyncio.AbstractEventLoop, coro):  # type: ignore[no-untyped-def]
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=10)


def test_scrape_counts_live_brokers_by_cluster_and_role_groups_without_master_and_topics(
    loop: asyncio.AbstractEventLoop,
) -> None:
    registry = EmbeddedRegistry()
    metrics = CollectorRegistry()
    NameServerMetrics(metrics, registry, loop)
    on(loop, registry.register(reg("h:1", 0, "a", topics=("orders", "audit"))))
    on(loop, registry.register(reg("h:2", 1, "a")))
    on(loop, registry.register(reg("h:3", 1, "b", topics=("ignored-from-a-slave",))))
    on(loop, registry.register(reg("h:4", 0, "x", cluster="c2", topics=("orders",))))

    def value(name: str, **labels: str) -> float | None:
        return metrics.get_sample_value(name, labels)

    assert value("tidemq_nameserver_brokers", cluster="c1", role="SYNC_MASTER") == 1
    assert value("tidemq_nameserver_brokers", cluster="c1", role="SLAVE") == 2
    assert value("tidemq_nameserver_brokers", cluster="c1", role="ASYNC_MASTER") == 0
    assert value("tidemq_nameserver_brokers", cluster="c2", role="SYNC_MASTER") == 1
    assert value("tidemq_nameserver_groups_without_master", cluster="c1") == 1  # group b
    assert value("tidemq_nameserver_groups_without_master", cluster="c2") == 0
    assert value("tidemq_nameserver_topics") == 2
    assert value("tidemq_nameserver_registry_stale") == 0

    on(loop, registry.unregister("c1", "b", 1, "h:3"))
    assert value("tidemq_nameserver_brokers", cluster="c1", role="SLAVE") == 1
    assert value("tidemq_nameserver_groups_without_master", cluster="c1") == 0


def test_a_registry_that_has_no_routes_yet_shows_only_that_it_is_stale(
    loop: asyncio.AbstractEventLoop,
) -> None:
    class Unread(EmbeddedRegistry):
        async def cluster_info(self):  # type: ignore[no-untyped-def]
            raise RegistryUnavailableError("not read yet")

        async def status(self):  # type: ignore[no-untyped-def]
            return SimpleNamespace(stale=True)

    metrics = CollectorRegistry()
    NameServerMetrics(metrics, Unread(), loop)
    names = {s.name for m in metrics.collect() for s in m.samples}
    assert metrics.get_sample_value("tidemq_nameserver_registry_stale") == 1
    assert "tidemq_nameserver_brokers" not in names
    assert "tidemq_nameserver_topics" not in names


def test_route_queries_are_counted_by_outcome_each_from_zero(
    loop: asyncio.AbstractEventLoop,
) -> None:
    registry = EmbeddedRegistry()
    metrics = CollectorRegistry()
    served = NameServerMetrics(metrics, registry, loop)
    servicer = NameServerServicer(registry, served.route_query)
    on(loop, registry.register(reg("h:1", 0, "a", topics=("orders",))))

    def query(topic: str) -> None:
        refused = pytest.raises(ServiceError) if topic != "orders" else contextlib.nullcontext()
        with refused:
            on(loop, servicer._query_route(SimpleNamespace(topic=topic)))

    def count(outcome: str) -> float | None:
        return metrics.get_sample_value(
            "tidemq_nameserver_route_queries_total", {"outcome": outcome}
        )

    assert [count(o) for o in ("found", "not_found", "unavailable", "invalid")] == [0, 0, 0, 0]
    query("orders")
    query("orders")
    query("nope")
    query("bad topic name!")
    assert [count(o) for o in ("found", "not_found", "unavailable", "invalid")] == [2, 1, 0, 1]
