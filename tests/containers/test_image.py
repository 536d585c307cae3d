"""The image itself, as the cluster runs it: an unprivileged user, a HEALTHCHECK that follows
the server, a clean stop on SIGTERM, a broker's store that outlives its process, and RocketMQ 5's
protocol served by default for the official clients."""

from __future__ import annotations

from pathlib import Path

import grpc

from tests.containers.conftest import MakeCluster
from tests.interop.clients import run_python_docs_example
from tests.waiting import wait_until
from tidemq import SendStatus
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2, service_pb2_grpc


def test_image_runs_unprivileged_and_its_healthcheck_follows_the_server(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(slaves=0, nameservers=1)
    for node in (cluster.nameservers[0], cluster.master()):
        container = node.container.get_wrapped_container()
        assert container.exec_run(["id", "-u"]).output.decode().strip() == "10001"
        # What the engine runs every 10 s (podman needs systemd for the schedule: run it here).
        check = container.attrs["Config"]["Healthcheck"]  # the image's, as the engine keeps it
        assert check["Test"][0] == "CMD"
        result = container.exec_run(check["Test"][1:])
        assert result.exit_code == 0, result.output.decode()
        assert b"SERVING" in result.output


def test_the_image_runs_the_compiled_record_codecs_and_glibcs_heap_for_large_buffers(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(slaves=0, nameservers=1)
    container = cluster.master().container.get_wrapped_container()
    probe = (
        "from tidemq.storage.record import block; from tidemq.protos import record_blocks; "
        "print(block.IMPLEMENTATION, record_blocks.IMPLEMENTATION)"
    )
    result = container.exec_run(["python", "-c", probe])
    assert result.exit_code == 0, result.output.decode()
    assert result.output.decode().split() == ["c", "c"]  # built in the image, not the twins
    env = container.attrs["Config"]["Env"]
    assert "MALLOC_MMAP_THRESHOLD_=8388608" in env


def test_sigterm_stops_a_broker_cleanly_and_its_store_survives_a_restart(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(slaves=0, nameservers=1)
    with cluster.admin() as admin:
        admin.create_topic("orders", queues=2)
    with cluster.producer() as producer:
        sent = {producer.send("orders", f"m{i}").msg_id for i in range(50)}
    master = cluster.master()

    assert cluster.stop(master, timeout_s=30) == 0  # not killed at the deadline: it exited
    assert "broker broker-a stopped cleanly" in master.logs()
    cluster.start_node(master)
    cluster.wait_routed(30)

    seen: set[str] = set()
    with cluster.consumer("after-restart", "orders", start_from="first") as consumer:

        def all_back() -> bool:
            seen.update(m.msg_id for m in consumer.poll(max_messages=100, timeout_s=0.5))
            return sent <= seen

        wait_until(all_back, 30, "the messages stored before the restart")
    with cluster.producer() as producer:
        assert producer.send("orders", b"after").status is SendStatus.SEND_OK


def test_the_official_python_client_finds_and_uses_every_broker_through_any_brokers_v2_port(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    """Brokers of the image serve RocketMQ 5's protocol with no flag, advertising their container
    address: the slave's listener answers the route naming the master, and the docs' Python
    example, given only the slave's endpoint, sends to and receives from the master."""
    cluster = make_cluster(slaves=1, nameservers=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    with cluster.admin() as admin:
        admin.create_topic("example-orders", queues=2)

    with grpc.insecure_channel(slave.rocketmq_address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def route() -> dict[str, set[int]]:
            """Each v2 address the route names, with the permissions of its queues (none while
            the topic is not routed yet: TOPIC_NOT_FOUND)."""
            answer = stub.QueryRoute(
                service_pb2.QueryRouteRequest(topic=v2.Resource(name="example-orders")),
                metadata=(("x-mq-client-id", "test-image"),),
                timeout=5,
            )
            named: dict[str, set[int]] = {}
            for q in answer.message_queues:
                (address,) = q.broker.endpoints.addresses
                named.setdefault(f"{address.host}:{address.port}", set()).add(q.permission)
            return named

        # A slave is named (clients keep a connection to it for when it is master) with no
        # usable queue: it serves no receive.
        wanted = {master.rocketmq_address: {v2.READ_WRITE}, slave.rocketmq_address: {v2.NONE}}
        wait_until(lambda: route() == wanted, 30, f"the slave's route naming {wanted}")

    run_python_docs_example(slave.rocketmq_address, tmp_path / "clients")
    assert cluster.rocketmq_endpoints == ";".join(n.rocketmq_address for n in (master, slave))
