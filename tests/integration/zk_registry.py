"""Nameservers and brokers on a real ZooKeeper, as the ZooKeeper tests start and read them.

Brokers here ask for 4 s sessions (the server's tickTime is 500 ms), so a dead broker leaves the
routes within seconds; every wait is a condition with a deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.errors import detail_from_metadata

RPC_TIMEOUT_S = 5.0
SESSION_MS = 4_000
# ZooKeeper expires a session at its timeout rounded up to a tick, and then the nameserver needs
# a watch event and a read; generous for a loaded 2-core machine, still well below a clean stop's
# proof window (see test_zookeeper_sessions.py: test_clean_shutdown_leaves_the_routes_at_once).
EXPIRY_SLACK_S = 4.0
CLUSTER = "DefaultCluster"


def zk_flags(zk: ZooKeeperServer, root: str) -> tuple[str, ...]:
    return ("--zk", zk.hosts, "--zk-root", root)


def start_zk_broker(
    start_broker: StartBroker,
    zk: ZooKeeperServer,
    root: str,
    name: str = "broker-a",
    *,
    session_ms: int = SESSION_MS,
    port: int | None = None,
) -> BrokerProcess:
    return start_broker(
        "--broker-name",
        name,
        *zk_flags(zk, root),
        "--zk-session-timeout-ms",
        str(session_ms),
        store=name,
        port=port,
    )


def routed_broker(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    zk: ZooKeeperServer,
    root: str,
    *,
    session_ms: int = SESSION_MS,
) -> tuple[NameServerProcess, BrokerProcess]:
    """A nameserver and broker-a on ZooKeeper, once the nameserver routes its topic "orders"."""
    ns = start_nameserver(*zk_flags(zk, root))
    b = start_zk_broker(start_broker, zk, root, session_ms=session_ms)
    create_topic(b, "orders")
    wait_until(lambda: route_of(ns, "orders") is not None, 20, "the route of orders")
    return ns, b


def create_topic(b: BrokerProcess, topic: str, queues: int = 4) -> None:
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues
            )
        ),
        timeout=RPC_TIMEOUT_S,
    )


def query_route(ns: NameServerProcess, topic: str) -> Any:
    return ns.stub().QueryRoute(
        nameserver_pb2.QueryRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
    )


def route_of(ns: NameServerProcess, topic: str) -> dict[str, dict[int, str]] | None:
    """Broker name -> {id: address} for ``topic``, or None when no group serves it."""
    try:
        route = query_route(ns, topic)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
            return None
        raise
    return {b.broker_name: dict(b.addresses) for b in route.brokers}


def cluster_info(ns: NameServerProcess) -> Any:
    return ns.stub().GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)


def status(ns: NameServerProcess) -> Any:
    return ns.stub().GetStatus(nameserver_pb2.GetStatusRequest(), timeout=RPC_TIMEOUT_S)


def typed_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, Any]:
    """The status and ErrorDetail of a call that must fail."""
    with pytest.raises(grpc.RpcError) as failure:
        call()
    error: Any = failure.value  # grpc's errors are also the Call, with code() and trailers
    detail = detail_from_metadata(error.trailing_metadata())
    assert detail is not None, "every error carries its typed detail"
    return error.code(), detail


def wire(message: Any) -> bytes:
    return bytes(message.SerializeToString(deterministic=True))


def znode_owner(zk: ZooKeeperServer, root: str, name: str, broker_id: int = 0) -> int:
    """The session owning a broker's znode; 0 when there is no znode."""
    with zk.client() as client:
        stat = client.exists(f"{root}/clusters/{CLUSTER}/{name}/{broker_id}")
    return 0 if stat is None else int(stat.ephemeralOwner)


def send_one(b: BrokerProcess, topic: str, body: bytes) -> Any:
    (result,) = (
        b.stub()
        .SendMessage(
            broker_pb2.SendMessageRequest(
                messages=[common_pb2.Message(topic=topic, body=body, queue_id=0)]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        .results
    )
    return result
