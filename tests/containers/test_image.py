"""The image itself, as the cluster runs it: an unprivileged user, a HEALTHCHECK that follows
the server, a clean stop on SIGTERM, and a broker's store that outlives its process."""

from __future__ import annotations

from tests.containers.conftest import MakeCluster
from tests.waiting import wait_until
from tidemq import SendStatus


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
