"""The nameserver as brokers and clients see it: a real process over real gRPC."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.conftest import NameServerProcess, StartNameServer
from tests.waiting import wait_until
from tidemq.protos import common_pb2, nameserver_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 5.0
MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"


def registration(
    address: str,
    broker_id: int = 0,
    *,
    topics: tuple[str, ...] = ("orders",),
    queues: int = 8,
    epoch: int = 0,
    cluster: str = "DefaultCluster",
    name: str = "broker-a",
) -> Any:
    host, port = address.rsplit(":", 1)
    return nameserver_pb2.RegisterBrokerRequest(
        broker=common_pb2.BrokerInfo(
            identity=common_pb2.BrokerIdentity(
                cluster=cluster, broker_name=name, broker_id=broker_id
            ),
            address=address,
            ha_address=f"{host}:{int(port) + 1}",
            role=common_pb2.SYNC_MASTER if broker_id == 0 else common_pb2.SLAVE,
            epoch=epoch,
            data_version=common_pb2.DataVersion(state_version=epoch, counter=1),
        ),
        topics=[
            common_pb2.TopicConfig(topic=t, read_queue_nums=queues, write_queue_nums=queues, perm=6)
            for t in topics
        ],
    )


def query_route(ns: NameServerProcess, topic: str) -> Any:
    return ns.stub().QueryRoute(
        nameserver_pb2.QueryRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
    )


def rpc_error(call: Any) -> grpc.RpcError:
    """The RpcError a call raised (grpc's errors are also the Call with its trailers)."""
    try:
        call()
    except grpc.RpcError as e:
        return e
    raise AssertionError("the call succeeded")


def status(ns: NameServerProcess) -> Any:
    return ns.stub().GetStatus(nameserver_pb2.GetStatusRequest(), timeout=RPC_TIMEOUT_S)


def test_registered_master_is_routed(nameserver: NameServerProcess) -> None:
    stub = nameserver.stub()
    reply = stub.RegisterBroker(registration(MASTER), timeout=RPC_TIMEOUT_S)
    assert (reply.master_address, reply.master_ha_address) == (MASTER, "127.0.0.1:10912")

    route = query_route(nameserver, "orders")
    assert route.topic == "orders"
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queues
    ] == [("broker-a", 8, 8, 6)]
    (group,) = route.brokers
    assert (group.cluster, group.broker_name, dict(group.addresses)) == (
        "DefaultCluster",
        "broker-a",
        {0: MASTER},
    )
    s = status(nameserver)
    assert (s.registry, s.stale, s.brokers) == ("embedded", False, 1)
    assert s.last_update_ms > 0


def test_master_and_slave_are_routed_with_the_masters_queues(
    nameserver: NameServerProcess,
) -> None:
    stub = nameserver.stub()
    first = stub.RegisterBroker(registration(SLAVE, 1, queues=2), timeout=RPC_TIMEOUT_S)
    assert first.master_address == ""  # no master yet
    stub.RegisterBroker(registration(MASTER, 0, queues=8), timeout=RPC_TIMEOUT_S)
    again = stub.RegisterBroker(registration(SLAVE, 1, queues=2), timeout=RPC_TIMEOUT_S)
    assert (again.master_address, again.master_ha_address) == (MASTER, "127.0.0.1:10912")

    route = query_route(nameserver, "orders")
    assert [(q.read_queue_nums, q.write_queue_nums) for q in route.queues] == [(8, 8)]
    (group,) = route.brokers
    assert dict(group.addresses) == {0: MASTER, 1: SLAVE}
    assert dict(group.ha_addresses) == {0: "127.0.0.1:10912", 1: "127.0.0.1:10922"}

    info = stub.GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
    (cluster,) = info.clusters
    assert cluster.cluster == "DefaultCluster"
    assert [(b.broker.identity.broker_id, b.broker.role) for b in cluster.brokers] == [
        (0, common_pb2.SYNC_MASTER),
        (1, common_pb2.SLAVE),
    ]

    # The master shuts down cleanly: consumers still find the slave, with the queue data.
    stub.UnregisterBroker(
        nameserver_pb2.UnregisterBrokerRequest(
            identity=common_pb2.BrokerIdentity(
                cluster="DefaultCluster", broker_name="broker-a", broker_id=0
            ),
            address=MASTER,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    route = query_route(nameserver, "orders")
    assert dict(route.brokers[0].addresses) == {1: SLAVE}
    assert route.queues[0].read_queue_nums == 8


def test_silent_broker_expires(start_nameserver: StartNameServer) -> None:
    ns = start_nameserver("--broker-expiry-ms", "1500", "--scan-interval-ms", "200")
    before_register = time.monotonic()
    ns.stub().RegisterBroker(registration(MASTER), timeout=RPC_TIMEOUT_S)
    assert query_route(ns, "orders").brokers[0].addresses[0] == MASTER

    def route_gone() -> bool:
        try:
            query_route(ns, "orders")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return True
        return False

    wait_until(route_gone, timeout_s=15.0, what="the silent broker to expire")
    # Expiry means "silent for more than 1500 ms" (whole milliseconds on the server's clock), so
    # it cannot have come at the first 200 ms scans.
    assert time.monotonic() - before_register >= 1.4
    assert status(ns).brokers == 0
    assert "expired DefaultCluster/broker-a id 0" in ns.log()


def test_unknown_topic_is_route_not_found(nameserver: NameServerProcess) -> None:
    err = rpc_error(lambda: query_route(nameserver, "nobody-serves-this"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    detail = detail_from_metadata(err.trailing_metadata())
    assert detail is not None
    assert (detail.code, detail.retriable) == (common_pb2.ROUTE_NOT_FOUND, False)


def _bad_registration(mutate: Any) -> Any:
    request = registration(MASTER)
    mutate(request)
    return request


BAD_INPUT = [
    ("empty topic", "QueryRoute", nameserver_pb2.QueryRouteRequest(topic=""), "INVALID_TOPIC"),
    (
        "topic with a space",
        "QueryRoute",
        nameserver_pb2.QueryRouteRequest(topic="a b"),
        "INVALID_TOPIC",
    ),
    (
        "address without a port",
        "RegisterBroker",
        _bad_registration(lambda r: setattr(r.broker, "address", "127.0.0.1")),
        "INVALID_ARGUMENT",
    ),
    (
        "address with port 70000",
        "RegisterBroker",
        _bad_registration(lambda r: setattr(r.broker, "address", "127.0.0.1:70000")),
        "INVALID_ARGUMENT",
    ),
    (
        "negative broker id",
        "RegisterBroker",
        _bad_registration(lambda r: setattr(r.broker.identity, "broker_id", -1)),
        "INVALID_ARGUMENT",
    ),
    (
        "empty cluster",
        "RegisterBroker",
        _bad_registration(lambda r: setattr(r.broker.identity, "cluster", "")),
        "INVALID_ARGUMENT",
    ),
    (
        "bad topic in a registration",
        "RegisterBroker",
        _bad_registration(lambda r: setattr(r.topics[0], "topic", "x" * 200)),
        "INVALID_TOPIC",
    ),
    (
        "no broker at all",
        "RegisterBroker",
        nameserver_pb2.RegisterBrokerRequest(),
        "INVALID_ARGUMENT",
    ),
    (
        "unregister with a negative id",
        "UnregisterBroker",
        nameserver_pb2.UnregisterBrokerRequest(
            identity=common_pb2.BrokerIdentity(cluster="c", broker_name="b", broker_id=-3),
            address=MASTER,
        ),
        "INVALID_ARGUMENT",
    ),
]


@pytest.mark.parametrize(
    ("method", "request_message", "code_name"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
def test_bad_input_is_a_typed_invalid_argument(
    nameserver: NameServerProcess, method: str, request_message: Any, code_name: str
) -> None:
    call = getattr(nameserver.stub(), method)
    err = rpc_error(lambda: call(request_message, timeout=RPC_TIMEOUT_S))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = detail_from_metadata(err.trailing_metadata())
    assert detail is not None, "no ErrorDetail in the trailers"
    assert (common_pb2.ErrorCode.Name(detail.code), detail.retriable) == (code_name, False)
    assert detail.message
    # Still healthy, still serving, and nothing was registered.
    assert nameserver.proc.poll() is None
    assert status(nameserver).brokers == 0


def test_stale_master_is_refused_with_stale_epoch(nameserver: NameServerProcess) -> None:
    stub = nameserver.stub()
    stub.RegisterBroker(registration(SLAVE, 0, epoch=2), timeout=RPC_TIMEOUT_S)
    err = rpc_error(
        lambda: stub.RegisterBroker(registration(MASTER, 0, epoch=1), timeout=RPC_TIMEOUT_S)
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = detail_from_metadata(err.trailing_metadata())
    assert detail is not None
    assert (detail.code, detail.retriable) == (common_pb2.STALE_EPOCH, False)
    assert dict(query_route(nameserver, "orders").brokers[0].addresses) == {0: SLAVE}


def test_health_service_reports_serving(nameserver: NameServerProcess) -> None:
    with grpc.insecure_channel(nameserver.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tidemq.v1.NameServer"):
            reply = health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_sigterm_stops_it_promptly_with_exit_code_0(nameserver: NameServerProcess) -> None:
    started = time.monotonic()
    assert nameserver.terminate(timeout_s=5.0) == 0
    assert time.monotonic() - started < 5.0
    log = nameserver.log()
    assert f"nameserver serving on {nameserver.address}" in log
    assert "nameserver stopped" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--listen", "localhost"), "--listen 'localhost' is not HOST:PORT"),
        (
            ("--listen", "127.0.0.1:0", "--metrics-listen", "9090"),
            "--metrics-listen '9090' is not HOST:PORT",
        ),
    ],
)
def test_bad_listen_address_is_one_line_and_exit_2(flags: tuple[str, ...], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "nameserver", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"tidemq nameserver: {message}"]


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a\x05ab",  # field 1 announces 5 bytes, 2 follow
        b"\x0a\x02\xff\xfe",  # topic that is not UTF-8
        b"\x0f\x00",  # wire type 7 does not exist
    ],
)
def test_undecodable_request_is_a_typed_invalid_argument(
    nameserver: NameServerProcess, payload: bytes
) -> None:
    call = nameserver.channel().unary_unary("/tidemq.v1.NameServer/QueryRoute")
    e = rpc_error(lambda: call(payload, timeout=10))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = detail_from_metadata(e.trailing_metadata())
    assert detail is not None and detail.code == common_pb2.INVALID_ARGUMENT
    assert status(nameserver).registry == "embedded"  # and it still serves
