"""Series an operator alerts on, scraped from real processes: a broker's per-queue consumer
offsets and lag, a nameserver's brokers, topics and route queries, and the SDK's own series
counting what a real producer and real consumers did."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer, free_port
from tests.integration.receive_sdk_helpers import _receive_n
from tests.integration.test_broker import create_topic, send
from tests.integration.test_broker_operations import sample, scrape
from tests.integration.test_sdk import _routable, broker_flags
from tests.waiting import wait_until
from tidemq.errors import RouteNotFoundError
from tidemq.protos import broker_pb2, nameserver_pb2

pytestmark = pytest.mark.integration


def test_per_queue_lag_falls_to_zero_as_a_group_commits_each_queue(
    start_broker: StartBroker,
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    b = start_broker("--metrics-listen", metrics)
    stub = b.stub()
    create_topic(b, "orders", queues=2)
    send(b, "orders", [b"a"] * 3, queue_id=0)
    send(b, "orders", [b"b"] * 2, queue_id=1)
    wait_until(
        lambda: (
            sample(scrape(metrics), "tidemq_queue_max_offset", topic="orders", queue_id="1") == 2
        ),
        20,
        "both sends to be readable",
    )

    def commit(queue_id: int, offset: int) -> None:
        stub.CommitOffset(
            broker_pb2.CommitOffsetRequest(
                group="g", topic="orders", queue_id=queue_id, offset=offset
            ),
            timeout=10,
        )

    def per_queue(name: str) -> list[float]:
        s = scrape(metrics)
        return [sample(s, name, group="g", topic="orders", queue_id=str(q)) for q in (0, 1)]

    commit(0, 1)
    commit(1, 0)
    assert per_queue("tidemq_consumer_offset") == [1, 0]
    assert per_queue("tidemq_consumer_queue_lag_messages") == [2, 2]
    commit(0, 3)
    assert per_queue("tidemq_consumer_queue_lag_messages") == [0, 2]  # queue 1 is the stuck one
    commit(1, 2)
    assert per_queue("tidemq_consumer_offset") == [3, 2]
    assert per_queue("tidemq_consumer_queue_lag_messages") == [0, 0]
    after = scrape(metrics)
    assert sample(after, "tidemq_consumer_lag_messages", group="g", topic="orders") == 0
    # A classic broker: its role as configured, the epoch every classic group has.
    assert sample(after, "tidemq_broker_role", role="ASYNC_MASTER") == 1
    assert sample(after, "tidemq_broker_epoch") == 0
    assert b.terminate() == 0


def test_nameserver_series_count_live_brokers_topics_and_route_queries(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    ns = start_nameserver("--metrics-listen", metrics)
    b = start_broker("--nameserver", ns.address, "--cluster", "east")
    create_topic(b, "orders")
    create_topic(b, "audit")

    def routed() -> bool:
        s = scrape(metrics)
        return (
            sample(s, "tidemq_nameserver_brokers", cluster="east", role="ASYNC_MASTER") == 1
            and sample(s, "tidemq_nameserver_topics") == 2
        )

    wait_until(routed, 20, "the broker and its two topics in the nameserver's series")
    before = scrape(metrics)
    stub = ns.stub()
    stub.QueryRoute(nameserver_pb2.QueryRouteRequest(topic="orders"), timeout=10)
    with pytest.raises(Exception, match="no broker group serves"):
        stub.QueryRoute(nameserver_pb2.QueryRouteRequest(topic="nowhere"), timeout=10)
    after = scrape(metrics)

    def moved(outcome: str) -> float:
        name = "tidemq_nameserver_route_queries_total"
        return sample(after, name, outcome=outcome) - sample(before, name, outcome=outcome)

    assert (moved("found"), moved("not_found")) == (1, 1)
    assert sample(after, "tidemq_nameserver_brokers", cluster="east", role="SLAVE") == 0
    assert sample(after, "tidemq_nameserver_groups_without_master", cluster="east") == 0
    assert sample(after, "tidemq_nameserver_registry_stale") == 0

    assert b.terminate() == 0  # a clean shutdown unregisters
    wait_until(
        lambda: (
            sample(
                scrape(metrics), "tidemq_nameserver_brokers", cluster="east", role="ASYNC_MASTER"
            )
            == 0
        ),
        20,
        "the stopped broker to leave the series",
    )


def test_sdk_series_count_a_producers_sends_and_a_consumers_messages_and_commits(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    ns = start_nameserver()
    start_broker("--nameserver", ns.address)
    _routable(ns.address)
    with tidemq.Admin(ns.address) as admin:
        admin.create_topic("orders", queues=2)
    registry = CollectorRegistry()
    m = tidemq.ClientMetrics(registry)

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    with tidemq.Producer(ns.address, metrics=m) as producer:
        futures = [producer.send_async("orders", b"x") for _ in range(50)]  # record blocks
        assert all(f.result(timeout=30).ok for f in futures)
        assert producer.send("orders", b"keyed", message_group="k").ok  # a plain request
        with pytest.raises(RouteNotFoundError):
            producer.send("nowhere", b"lost")
        requests = producer.stats.requests
    assert value("tidemq_client_sends_total", topic="orders", outcome="ok") == 51
    assert value("tidemq_client_sends_total", topic="nowhere", outcome="failed") == 1
    assert value("tidemq_client_send_retries_total", topic="orders") == 0
    # One observation per request and topic, not per message.
    assert value("tidemq_client_send_latency_seconds_count", topic="orders") == requests

    with tidemq.Consumer(
        ns.address, group="billing", topic="orders", start_from="first", metrics=m
    ) as consumer:
        got: list[tidemq.ReceivedMessage] = []

        def polled_all() -> bool:
            got.extend(consumer.poll(64, timeout_s=0.5))
            return len(got) >= 51

        wait_until(polled_all, 30, "every message polled")
    assert len(got) == 51
    assert value("tidemq_client_received_messages_total", topic="orders", group="billing") == 51
    # Closing committed what was polled, one commit per queue that had messages.
    assert value("tidemq_client_offset_commits_total", topic="orders", group="billing",
                 outcome="ok") == 2  # fmt: skip


def test_sdk_series_count_a_simple_consumers_receives_and_acks(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    ns = start_nameserver()
    start_broker(*broker_flags(ns, "broker-a"), store="broker-a")
    _routable(ns.address)
    with tidemq.Admin(ns.address) as admin:
        admin.create_topic("orders", queues=2)
        admin.update_consumer_group("receivers", retry_delays_s=[0.2])
    with tidemq.Producer(ns.address) as producer:
        assert all(producer.send("orders", f"m{i}").ok for i in range(5))
    registry = CollectorRegistry()
    config = tidemq.SimpleConsumerConfig(
        start_from="first", heartbeat_interval_ms=500, metrics=tidemq.ClientMetrics(registry)
    )
    with tidemq.SimpleConsumer("receivers", "orders", nameserver=ns.address, config=config) as c:
        got = _receive_n(c, 5, invisible_s=30.0)
        assert len(got) == 5
        errors = c.ack_many(got)
        assert errors == [None] * 5
        with pytest.raises(tidemq.TidemqError):
            c.ack(got[0])  # acked already: refused

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    common = {"topic": "orders", "group": "receivers"}
    assert value("tidemq_client_received_messages_total", **common) == 5
    assert value("tidemq_client_acks_total", outcome="ok", **common) == 5
    assert value("tidemq_client_acks_total", outcome="failed", **common) == 1
