"""``tidemq.testing.TidemqContainer`` on the real image: the docs' example as written, and
clients that are given only host-mapped ports (the SDK and the official RocketMQ Python client)
sent nowhere else by the routes."""

from __future__ import annotations

from pathlib import Path

import grpc

from tests.containers.documented import run_documented_test
from tests.interop.clients import ROOT, run_python_docs_example
from tests.waiting import wait_until
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2, service_pb2_grpc
from tidemq.testing import TidemqContainer

DOC = ROOT / "docs" / "testing.md"


def test_the_documented_one_container_example_passes() -> None:
    run_documented_test(DOC, "## One container")


def v2_route(endpoint: str, topic: str) -> set[str]:
    """The RocketMQ 5 addresses a route query to ``endpoint`` names for ``topic``."""
    with grpc.insecure_channel(endpoint) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=v2.Resource(name=topic)),
            metadata=(("x-mq-client-id", "test-container"),),
            timeout=5,
        )
    return {
        f"{a.host}:{a.port}" for q in answer.message_queues for a in q.broker.endpoints.addresses
    }


def test_clients_given_host_mapped_ports_are_routed_only_to_host_mapped_ports(
    tmp_path: Path,
) -> None:
    with TidemqContainer() as tidemq:
        print(f"TidemqContainer started in {tidemq.started_in_s:.1f} s")
        host = tidemq.get_container_host_ip()
        assert tidemq.get_nameserver_address() == f"{host}:{tidemq.get_exposed_port(9876)}"
        endpoint = tidemq.get_rocketmq_endpoint()
        with tidemq.admin() as admin:
            admin.create_topic("example-orders", queues=2)
            # The SDK's routes: the broker at its mapped port, not the container's address.
            assert admin.masters() == {"broker-a": tidemq.get_broker_address()}
        wait_until(lambda: v2_route(endpoint, "example-orders") == {endpoint}, 30, "v2 route")

        run_python_docs_example(endpoint, tmp_path / "clients")

        # A stop drains both servers: the container exits 0.
        container = tidemq.get_wrapped_container()
        container.stop(timeout=30)
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 0, tidemq.get_logs()
