"""ZooKeeper itself down: a nameserver keeps serving the routes it last read (marked stale) and
brokers keep serving messages while ZooKeeper is away; a nameserver started before ZooKeeper
answers UNAVAILABLE, not NOT_FOUND, until it has read it. Each test runs a ZooKeeper of its own.
"""

from __future__ import annotations

import grpc
import pytest

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.zk_registry import (
    cluster_info,
    create_topic,
    query_route,
    route_of,
    routed_broker,
    send_one,
    start_zk_broker,
    status,
    typed_error,
    wire,
    zk_flags,
)
from tests.integration.zookeeper import StartZooKeeper
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration


def test_routes_stay_while_zookeeper_is_down_and_turn_fresh_when_it_is_back(
    start_zookeeper: StartZooKeeper,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    zk = start_zookeeper()
    ns, b = routed_broker(start_nameserver, start_broker, zk, zk_root)
    wait_until(lambda: not status(ns).stale, 10, "the nameserver to be in sync")
    route_before = wire(query_route(ns, "orders"))
    info_before = wire(cluster_info(ns))

    zk.stop()
    wait_until(lambda: status(ns).stale, 10, "the nameserver to report its routes stale")
    s = status(ns)
    assert (s.registry, s.brokers) == ("zookeeper", 1)
    assert wire(query_route(ns, "orders")) == route_before
    assert wire(cluster_info(ns)) == info_before
    # The broker serves on without its registry.
    assert send_one(b, "orders", b"sent while ZooKeeper is down").status == broker_pb2.SEND_OK

    zk.start()  # same data and port: the broker's session and znode come back with it
    wait_until(lambda: not status(ns).stale, 20, "the nameserver to be in sync again")
    assert wire(query_route(ns, "orders")) == route_before
    assert send_one(b, "orders", b"sent after ZooKeeper is back").status == broker_pb2.SEND_OK


def test_nameserver_starts_before_zookeeper_and_catches_up(
    start_zookeeper: StartZooKeeper,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    zk = start_zookeeper(run=False)
    ns = start_nameserver(*zk_flags(zk, zk_root))
    s = status(ns)
    assert (s.registry, s.stale) == ("zookeeper", True)
    assert "never read" in s.detail
    # Not NOT_FOUND: that would tell clients the topic does not exist.
    code, detail = typed_error(lambda: query_route(ns, "orders"))
    assert (code, detail.code, detail.retriable) == (
        grpc.StatusCode.UNAVAILABLE,
        common_pb2.ROUTE_NOT_FOUND,
        True,
    )

    zk.start()
    wait_until(lambda: not status(ns).stale, 20, "the nameserver to read ZooKeeper")
    b = start_zk_broker(start_broker, zk, zk_root)
    create_topic(b, "orders")
    wait_until(lambda: route_of(ns, "orders") == {"broker-a": {0: b.address}}, 20, "the route")
