"""One client flooding the broker slows itself, not the others: a well-behaved client's p99
send latency under the flood stays within 5x of its unloaded value, and the broker stays up and
keeps answering the flooder (refusing some of its calls with the retriable BROKER_BUSY at
most)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.integration.conftest import BrokerProcess, StartBroker
from tests.integration.flood_client import QUEUES
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2

pytestmark = pytest.mark.integration

SENDS = 1000  # per measurement: the p99 is the tenth slowest, not one unlucky preemption
BUDGET_S = 20.0  # per measurement; unloaded, 1000 sends take about two seconds
IN_FLIGHT = 64  # the flooder's calls in flight at once
# 64 MiB CommitLog files: the flood writes a few hundred MiB; fewer, larger files
STORE = (
    '{"commitlog_file_size_bytes": 67108864, "consume_queue_entries_per_file": 100000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)
# On this 2-core machine, shared with other tests, one preemption of the broker or the client
# costs a millisecond or two whatever the load; an unloaded p99 below that measures the
# scheduler's luck in that second, not the broker, and 5x of it would fail on noise. The raw
# figures are printed either way.
P99_FLOOR_MS = 2.0
# While the measured client is active, the flooder may move 16 MiB/s; beyond that it is held
# back. (Without a byte rate, admission alone bounds what the flooder has in the broker, but
# sends beyond the disk's bandwidth stall the event loop in page-cache writes for everyone.)
QUOTA = str(16 << 20)


def create_topic(stub: broker_pb2_grpc.BrokerStub, topic: str, queues: int) -> None:
    config = common_pb2.TopicConfig(topic=topic, read_queue_nums=queues, write_queue_nums=queues)
    stub.CreateTopic(broker_pb2.CreateTopicRequest(topic=config), timeout=10)


def p99_send_ms(stub: broker_pb2_grpc.BrokerStub) -> tuple[float, int]:
    """The p99 of SENDS synchronous sends of one small message, in milliseconds, and how many
    were made: those not made within BUDGET_S (a starved client) count as taking forever."""
    request = broker_pb2.SendMessageRequest(
        messages=[common_pb2.Message(topic="good", body=b"g" * 100)]
    )
    took: list[float] = []
    deadline = time.monotonic() + BUDGET_S
    while len(took) < SENDS and time.monotonic() < deadline:
        started = time.perf_counter()
        response = stub.SendMessage(request, timeout=BUDGET_S)
        took.append((time.perf_counter() - started) * 1000)
        assert response.results[0].status == broker_pb2.SEND_OK
    made = len(took)
    took += [float("inf")] * (SENDS - made)
    return sorted(took)[int(SENDS * 0.99) - 1], made


def start_flooder(b: BrokerProcess, log: Path) -> subprocess.Popen[str]:
    args = ["-m", "tests.integration.flood_client", b.address, "flood", str(IN_FLIGHT)]
    with log.open("w") as stderr:
        flooder = subprocess.Popen(
            # It stands for a client on another machine: niced, its own work (encoding,
            # receiving a hundred MB/s) does not take the two cores from the broker and the
            # measured client, so what is measured is how the broker shares itself out.
            ["nice", "-n", "10", sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert flooder.stdout is not None
    line = flooder.stdout.readline()  # its first call answered (or its end)
    assert line.strip() == "flooding", f"flooder: {line!r}\n{log.read_text()}"
    return flooder


def test_one_client_flooding_slows_itself_not_a_well_behaved_client(
    start_broker: StartBroker, tmp_path: Path
) -> None:
    b = start_broker("--store-overrides", STORE, "--max-bytes-per-second-per-connection", QUOTA)
    with grpc.insecure_channel(b.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        create_topic(stub, "good", 1)
        create_topic(stub, "flood", QUEUES)
        # 5 MiB in each of the flooder's queues: each of its pulls can get the whole cap.
        body = common_pb2.Message(topic="flood", body=b"p" * 4096)
        for q in range(QUEUES):
            body.queue_id = q
            for _ in range(5):
                stub.SendMessage(broker_pb2.SendMessageRequest(messages=[body] * 256), timeout=30)
        p99_send_ms(stub)  # warm-up: connections, caches, the first CommitLog pages
        unloaded, _ = p99_send_ms(stub)

        flooder = start_flooder(b, tmp_path / "flooder.log")
        try:
            loaded, made = p99_send_ms(stub)
        finally:
            out, _ = flooder.communicate(timeout=60)  # closes its stdin: it stops
        outcomes = json.loads(out)
        status = stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)

    print(
        f"well-behaved client p99: unloaded {unloaded:.2f} ms, flooded {loaded:.2f} ms"
        f" ({made} of {SENDS} sends made in {BUDGET_S} s);"
        f" flooder: {outcomes}"
    )
    assert b.proc.poll() is None, "the broker died under the flood"
    assert status.running
    assert outcomes.get("OK", 0) > 0, f"the flooder was never answered: {outcomes}"
    refused = {k: n for k, n in outcomes.items() if k != "OK"}
    assert set(refused) <= {"RESOURCE_EXHAUSTED/BROKER_BUSY"}, outcomes
    assert loaded <= 5 * max(unloaded, P99_FLOOR_MS), (
        f"flooded p99 {loaded:.2f} ms > 5 x unloaded {unloaded:.2f} ms"
        f" (floor {P99_FLOOR_MS} ms); flooder: {outcomes}"
    )
