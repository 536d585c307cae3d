"""Retention on a master with a slave, over real processes: forced retention keeps what a stopped
slave has not acknowledged and what a consumer group has not read, and a slave that fell behind
the master's retention resynchronises by itself from the master's oldest file, its old store set
aside, not deleted.

CommitLog files are 64 KiB, so a few hundred messages cross several of them."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration import replicas
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.integration.replicas import (
    QUEUES,
    SLAVE_FLAGS,
    create_topic,
    max_offset,
    status,
    topic_names,
    wait_slave_holds,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

FILE = 64 * 1024
FILES = {
    "commitlog_file_size_bytes": FILE,
    "consume_queue_entries_per_file": 200,
    "index_slot_num": 1000,
    "index_max_num": 4000,
    "clean_resource_interval_ms": 200,
}
# Every pass is forced: the host's disk is always more than 0.1 % used. Never refuse writes.
FORCED = {
    **FILES,
    "disk_max_used_space_ratio": 0.001,
    "disk_space_clean_forcibly_ratio": 0.001,
    "disk_space_warning_level_ratio": 1.0,
}
# Every pass deletes files older than a second.
BY_AGE = {**FILES, "file_reserved_time_hours": 1 / 3600, "delete_when_hours": list(range(24))}


def start_master(
    start_broker: StartBroker, ns: NameServerProcess, store: Mapping[str, object], *flags: str
) -> BrokerProcess:
    master = replicas.start(start_broker, ns, "master", *flags, overrides=json.dumps(store))
    create_topic(master)
    return master


def start_slave(start_broker: StartBroker, ns: NameServerProcess, metrics: str) -> BrokerProcess:
    # The slave's own retention never runs: nothing of FILES is 72 hours old.
    slave = replicas.start(
        start_broker,
        ns,
        "slave",
        *SLAVE_FLAGS,
        "--metrics-listen",
        metrics,
        overrides=json.dumps(FILES),
    )
    wait_until(lambda: "orders" in topic_names(slave), 30, "the slave to learn topic 'orders'")
    return slave


def send(b: BrokerProcess, prefix: str, count: int) -> None:
    for start_at in range(0, count, 100):
        msgs = [
            common_pb2.Message(
                topic="orders", body=f"{prefix}-{i}-".encode() * 30, queue_id=i % QUEUES
            )
            for i in range(start_at, min(count, start_at + 100))
        ]
        r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
        assert {x.status for x in r.results} == {broker_pb2.SEND_OK}


def min_offset(b: BrokerProcess) -> int:
    return int(status(b).store.commitlog_min_offset)


def acked(master: BrokerProcess) -> int | None:
    slaves = status(master).replication.slaves
    return int(slaves[0].acked_offset) if slaves else None


def counter(metrics: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def pull_retained(b: BrokerProcess, queue_id: int) -> list[tuple[int, bytes]]:
    """Everything one queue still holds, as (queue offset, body): a pull below the queue's
    minimum answers with the minimum as its next offset."""
    got: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        r = b.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group="g", topic="orders", queue_id=queue_id, offset=offset, max_messages=512
            ),
            timeout=10,
        )
        got += [(m.queue_offset, m.body) for m in r.messages]
        if not r.messages and r.next_offset <= offset:
            return got
        offset = r.next_offset


def all_queues(b: BrokerProcess) -> list[list[tuple[int, bytes]]]:
    return [pull_retained(b, q) for q in range(QUEUES)]


def test_forced_retention_keeps_the_files_a_stopped_slave_has_not_acknowledged(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_master(start_broker, nameserver, FORCED, "--metrics-listen", metrics)
    slave = start_slave(start_broker, nameserver, f"127.0.0.1:{free_port()}")
    send(master, "before", 400)
    end = max_offset(master)
    wait_until(lambda: acked(master) == end, 30, f"the slave to acknowledge {end}")
    assert slave.terminate() == 0
    # Forced passes delete what the slave holds, never the file it stopped in.
    keep_from = end - end % FILE
    wait_until(lambda: min_offset(master) == keep_from, 30, "forced retention to reach the slave")
    send(master, "after", 800)  # several files the slave has not seen
    assert max_offset(master) > keep_from + 3 * FILE
    wait_until(
        lambda: "retention kept CommitLog file" in master.log() or min_offset(master) > keep_from,
        30,
        "a forced pass to keep the slave's file (or delete it)",
    )
    assert min_offset(master) == keep_from  # the unreplicated file survived forced retention
    assert "an in-sync slave has acknowledged only up to" in master.log()
    assert counter(metrics, "tidemq_retention_files_kept_total", reason="unreplicated") == 1

    slave = start_slave(start_broker, nameserver, f"127.0.0.1:{free_port()}")
    end = max_offset(master)
    wait_slave_holds(slave, end, 60)
    assert "resynchronises" not in slave.log()  # it continued where it stopped
    assert sum(len(q) for q in all_queues(slave)) == 1200
    # Acknowledged at last: the floor moves and forced retention goes on.
    wait_until(lambda: min_offset(master) > keep_from, 30, "forced retention to move on")


def test_slave_behind_the_masters_retention_resynchronises_and_keeps_its_old_store(
    nameserver: NameServerProcess, start_broker: StartBroker, tmp_path: Path
) -> None:
    # A stopped slave more than one file behind is out of sync: it holds retention back no more.
    config = tmp_path / "master.toml"
    config.write_text(f"[replication]\ninsync_max_lag_bytes = {FILE}\n")
    master = start_master(start_broker, nameserver, BY_AGE, "--config", str(config))
    slave_metrics = f"127.0.0.1:{free_port()}"
    slave = start_slave(start_broker, nameserver, slave_metrics)
    send(master, "old", 300)
    end = max_offset(master)
    wait_slave_holds(slave, end)
    assert slave.terminate() == 0
    old_files = sorted(p.name for p in (tmp_path / "slave" / "commitlog").iterdir())
    send(master, "new", 900)
    # Age-based retention leaves only the newest file, far past the slave's end.
    wait_until(
        lambda: min_offset(master) == max_offset(master) - max_offset(master) % FILE,
        30,
        "retention to delete everything but the newest file",
    )
    lo = min_offset(master)
    assert lo > end

    slave = start_slave(start_broker, nameserver, slave_metrics)
    wait_until(lambda: "resynchronises from" in slave.log(), 30, "the slave to resynchronise")
    hi = max_offset(master)
    wait_slave_holds(slave, hi)
    assert min_offset(slave) == lo
    assert all_queues(slave) == all_queues(master)
    assert sum(len(q) for q in all_queues(slave)) > 0
    assert counter(slave_metrics, "tidemq_replication_resyncs_total") == 1
    behind = list((tmp_path / "slave" / "behind").iterdir())
    assert len(behind) == 1
    assert sorted(p.name for p in (behind[0] / "commitlog").iterdir()) == old_files
    assert (behind[0] / "consumequeue").is_dir()


def test_forced_retention_keeps_what_a_consumer_group_has_not_read(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_master(start_broker, nameserver, FORCED, "--metrics-listen", metrics)
    commit = broker_pb2.CommitOffsetRequest(group="slow", topic="orders", queue_id=0, offset=0)
    master.stub().CommitOffset(commit, timeout=10)
    send(master, "m", 1200)
    assert max_offset(master) > 4 * FILE
    wait_until(
        lambda: "retention kept CommitLog file" in master.log() or min_offset(master) > 0,
        30,
        "a forced pass to keep the file the group reads next (or delete it)",
    )
    assert min_offset(master) == 0
    assert counter(metrics, "tidemq_retention_files_kept_total", reason="unconsumed") == 1
    assert "a consumer group has not read all of it" in master.log()
    assert len(pull_retained(master, 0)) == 300
    # The group reads on: what it has consumed may go.
    commit.offset = 200
    master.stub().CommitOffset(commit, timeout=10)
    wait_until(lambda: min_offset(master) > 0, 30, "forced retention to follow the group")
    assert pull_retained(master, 0)[0][0] <= 200
