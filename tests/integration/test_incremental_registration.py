"""A broker registers with an embedded-registry nameserver incrementally: after the first full
registration, heartbeats and topic changes carry only what changed, and a nameserver that lost
its table (restarted) gets everything again without anyone intervening.

Real nameserver and broker processes over real gRPC; the nameserver's own metrics say which
kind of registration it accepted.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
import pytest

import tidemq
from tests.integration.conftest import (
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
    spawn,
)
from tests.waiting import wait_until
from tidemq.protos import nameserver_pb2

pytestmark = pytest.mark.integration

TOPICS = 60


def registrations(metrics: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tidemq_nameserver_registrations_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def routed(ns: NameServerProcess, topic: str) -> bool:
    try:
        ns.stub().QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic), timeout=5)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def test_topic_changes_reach_the_nameserver_as_deltas_and_a_restarted_one_gets_everything(
    start_nameserver: StartNameServer, start_broker: StartBroker, tmp_path: Path
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    ns = start_nameserver("--metrics-listen", metrics)
    start_broker("--nameserver", ns.address, "--register-interval-ms", "300")
    wait_until(lambda: registrations(metrics).get("full", 0) >= 1, 30, "first registration")

    with tidemq.Admin(ns.address) as admin:
        for i in range(TOPICS):
            admin.create_topic(f"inc-{i}", queues=2)
        admin.delete_topic("inc-7")
    assert not routed(ns, "inc-7")
    assert all(routed(ns, f"inc-{i}") for i in range(TOPICS) if i != 7)
    # Heartbeats keep flowing as deltas; the broker was sent in full only once.
    wait_until(
        lambda: registrations(metrics).get("incremental", 0) >= TOPICS + 5,
        30,
        "incremental heartbeats",
    )
    seen = registrations(metrics)
    assert seen["full"] == 1
    assert seen["full_needed"] == 0

    # The nameserver restarts on the same address with an empty table: the broker's next delta
    # is refused with full_registration_needed, and a full registration follows at once.
    ns.kill()
    metrics_again = f"127.0.0.1:{free_port()}"
    proc = spawn(
        ["nameserver", "--listen", ns.address, "--metrics-listen", metrics_again],
        tmp_path / "nameserver-again.log",
    )
    again = NameServerProcess(proc, ns.address, tmp_path / "nameserver-again.log")
    try:
        again.wait_serving()
        wait_until(lambda: routed(again, f"inc-{TOPICS - 1}"), 30, "routes after the restart")
        assert all(routed(again, f"inc-{i}") for i in range(TOPICS) if i != 7)
        assert not routed(again, "inc-7")
        after = registrations(metrics_again)
        assert after["full"] == 1
        assert after["full_needed"] == 1
    finally:
        again.terminate()
