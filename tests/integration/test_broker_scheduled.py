"""The broker's scheduled tasks against a real broker: a deleted topic's committed offsets are
dropped after the grace period, and ``tidemq cluster status --daily`` shows the day's messages in
and out per topic, kept across a restart."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until
from tidemq.admin import Admin
from tidemq.consumer import Consumer
from tidemq.producer import Producer
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration


def start(start_broker: StartBroker, ns: str, config: Path) -> BrokerProcess:
    return start_broker(
        *("--nameserver", ns, "--broker-name", "broker-a", "--config", str(config)),
        store="broker-a",
    )


def position_topics(b: BrokerProcess) -> set[str]:
    r = b.stub().GetOffsetTable(broker_pb2.GetOffsetTableRequest(), timeout=10)
    return {p.topic for p in r.positions}


def daily(ns: str) -> dict[str, tuple[int, int]]:
    out = tidemq(ns, "cluster", "status", "--json", "--interval", "0", "--daily", "3").stdout
    [broker] = [b for c in json.loads(out)["clusters"] for b in c["brokers"]]
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    return {
        d["topic"]: (d["messages_in"], d["messages_out"])
        for d in broker.get("daily", [])
        if d["day"] == today
    }


def consume(ns: str, topic: str, want: int) -> None:
    """As group g, read ``want`` messages and commit."""
    with Consumer(ns, group="g", topic=topic, start_from="first", auto_commit=False) as c:
        got = 0
        deadline = time.monotonic() + 20
        while got < want and time.monotonic() < deadline:
            got += len(c.poll(max_messages=want - got, timeout_s=1))
        c.commit()
    assert got == want


def test_deleted_topics_lose_their_offsets_and_days_are_counted(
    start_nameserver: StartNameServer, start_broker: StartBroker, tmp_path: Path
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("deleted_topic_offsets_grace_ms = 1000\n")
    ns = start_nameserver().address
    broker = start(start_broker, ns, config)
    with Admin(ns) as admin, Producer(ns) as producer:
        wait_until(lambda: bool(admin.masters()), 30, "the broker to register")
        for topic in ("kept", "gone"):
            admin.create_topic(topic, queues=1)
            producer.send(topic, "first")
            consume(ns, topic, 1)  # the group's position exists: its growth counts from here
        # Reading the statistics takes a sample: from here on the groups' positions are known,
        # and the messages sent before are counted as stored but not as consumed.
        assert daily(ns)["kept"] == (1, 0)
        for _ in range(4):
            producer.send("kept", "x")
        consume(ns, "kept", 4)
        assert position_topics(broker) >= {"kept", "gone"}
        admin.delete_topic("gone")
    assert daily(ns)["kept"] == (5, 4)
    wait_until(lambda: "gone" not in position_topics(broker), 15, "gone's offsets to be dropped")
    assert "kept" in position_topics(broker)

    assert broker.terminate() == 0
    start(start_broker, ns, config)
    text = tidemq(ns, "cluster", "status", "--interval", "0", "--daily").stdout
    assert "DAY" in text and "kept" in text  # persisted across the restart
    assert daily(ns)["kept"] == (5, 4)
