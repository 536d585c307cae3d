"""``tidemq bench receive`` against a real broker: each mode consumes exactly what the topic
holds and leaves the group's receive state as its JSON says (acked: nothing in flight, every
queue done; hold: everything received still in flight)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import grpc
import pytest

import tidemq
from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.integration

TOPIC = "bench-receive"
MESSAGES = 1_200


@pytest.fixture
def loaded(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> tuple[str, BrokerProcess]:
    """A broker whose topic holds MESSAGES messages of 1 KiB."""
    ns = start_nameserver()
    broker = start_broker(
        "--nameserver", ns.address, "--broker-name", "broker-a", "--auto-create-topics"
    )
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master broker routed")
    with tidemq.Producer(ns.address) as producer:
        for f in [producer.send_async(TOPIC, b"x" * 1024) for _ in range(MESSAGES)]:
            f.result()
    return ns.address, broker


def bench_receive(nameserver: str, *args: str) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "bench", "receive", "--topic", TOPIC, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TIDEMQ_NAMESERVER": nameserver},
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, f"tidemq bench receive failed:\n{r.stdout}\n{r.stderr}"
    result: dict[str, Any] = json.loads(r.stdout)
    return result


def receive_state(broker: BrokerProcess, group: str) -> Any:
    stub = broker_pb2_grpc.BrokerStub(broker.channel())
    try:
        return stub.GetReceiveState(broker_pb2.GetReceiveStateRequest(group=group, topic=TOPIC))
    except grpc.RpcError as e:
        pytest.fail(f"GetReceiveState failed: {e}")


@pytest.mark.parametrize("mode", ["simple", "async", "push"])
def test_bench_receive_acks_every_message_the_topic_holds(
    loaded: tuple[str, BrokerProcess], mode: str
) -> None:
    nameserver, broker = loaded
    group = f"bench-{mode}"
    out = bench_receive(
        nameserver, "--mode", mode, "--group", group, "--messages", str(MESSAGES), "--json"
    )
    assert (out["mode"], out["messages"], out["complete"]) == (mode, MESSAGES, True)
    assert (out["ack_errors"], out["redelivered"]) == (0, 0)
    assert out["msgs_per_s"] > 0 and out["client_cpu_us_per_msg"] > 0
    state = receive_state(broker, group)
    assert sum(q.inflight for q in state.queues) == 0
    assert sum(q.done_offset for q in state.queues) == MESSAGES
    assert all(q.done_offset == q.max_offset for q in state.queues)


def test_bench_receive_hold_leaves_what_it_received_in_flight(
    loaded: tuple[str, BrokerProcess],
) -> None:
    nameserver, broker = loaded
    out = bench_receive(
        nameserver, "--mode", "hold", "--group", "holder", "--messages", "500", "--json"
    )
    assert (out["messages"], out["acked"], out["complete"]) == (500, False, True)
    state = receive_state(broker, "holder")
    assert sum(q.inflight for q in state.queues) == 500
    assert sum(q.done_offset for q in state.queues) == 0


def test_bench_receive_refuses_a_bad_mode_and_sizes(loaded: tuple[str, BrokerProcess]) -> None:
    nameserver, _ = loaded
    refusals = {
        ("--mode", "pull"): "invalid choice: 'pull'",
        ("--batch", "0"): "--messages, --batch and --invisible-s must be > 0",
        ("--messages", "-1"): "--messages, --batch and --invisible-s must be > 0",
    }
    for args, says in refusals.items():
        r = subprocess.run(
            [sys.executable, "-m", "tidemq.cli", "bench", "receive", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "TIDEMQ_NAMESERVER": nameserver},
            timeout=60,
            check=False,
        )
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
