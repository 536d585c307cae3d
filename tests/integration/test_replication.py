"""Replication over real processes: a master and its slave, registered with a real nameserver,
with 1 MiB CommitLog files so every test crosses several of them."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.replicas import (
    GROUP,
    ONE_MIB_FILES,
    assert_same_queues,
    commitlog,
    create_topic,
    master_and_slave,
    send_batches,
    start,
    start_slave,
    wait_identical,
    while_streaming,
)
from tidemq.protos import common_pb2, replication_pb2, replication_pb2_grpc
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration


def test_async_master_streams_10000_messages_to_its_slave(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    send_batches(master, "m", 10_000)
    assert len(commitlog(master)) >= 4
    wait_identical(master, slave)
    assert_same_queues(master, slave, 10_000)


def test_empty_slave_joining_late_gets_the_whole_history(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    send_batches(master, "old", 8_000)
    assert len(commitlog(master)) >= 3
    slave = start_slave(start_broker, nameserver)
    wait_identical(master, slave)
    assert "from the master's min offset 0" in master.log()
    assert_same_queues(master, slave, 8_000)


@pytest.mark.parametrize(
    ("cluster", "name", "broker_id"),
    [("DefaultCluster", "group-b", 1), ("OtherCluster", GROUP, 1), ("DefaultCluster", GROUP, 0)],
)
def test_a_stranger_is_refused(
    nameserver: NameServerProcess,
    start_broker: StartBroker,
    cluster: str,
    name: str,
    broker_id: int,
) -> None:
    master = start(start_broker, nameserver, "master")
    hs = replication_pb2.Handshake(
        cluster=cluster,
        broker_name=name,
        broker_id=broker_id,
        commitlog_file_size=1 << 20,
        empty=True,
    )
    stub = replication_pb2_grpc.ReplicationStub(master.channel())
    call = stub.Stream(iter([replication_pb2.SlaveMessage(handshake=hs)]), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        list(call)
    e = err.value
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED
    detail = detail_from_metadata(e.trailing_metadata())
    assert detail is not None
    assert (detail.code, detail.retriable) == (common_pb2.NO_PERMISSION, False)
    assert "cannot replicate" in detail.message or "not in this group" in detail.message


def test_diverged_slave_truncates_keeps_evidence_and_matches(
    nameserver: NameServerProcess, start_broker: StartBroker, tmp_path: Path
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    send_batches(master, "common", 3_000)
    slave = start_slave(start_broker, nameserver)
    wait_identical(master, slave)
    assert slave.terminate() == 0
    send_batches(master, "master-only", 2_000)
    # The slave's store is then used by a stand-alone master that takes different messages.
    rogue = start_broker(
        "--broker-name", "rogue", "--store-overrides", ONE_MIB_FILES, store="slave"
    )
    send_batches(rogue, "rogue", 1_500)
    assert rogue.terminate() == 0
    slave = start_slave(start_broker, nameserver)
    wait_identical(master, slave)
    assert "last common offset" in slave.log()
    evidence = tmp_path / "slave" / "evidence"
    assert evidence.is_dir() and any(evidence.iterdir())
    assert_same_queues(master, slave, 5_000)


def test_slave_killed_mid_stream_restarts_and_catches_up(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    while_streaming(master, slave, 12_000, slave.kill)
    slave = start_slave(start_broker, nameserver)
    wait_identical(master, slave)
    assert_same_queues(master, slave, 12_000)


def test_slave_stops_cleanly_while_streaming_under_load(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    # SIGTERM mid-stream: the replication link must let go (a cancellation lost inside gRPC
    # once kept it reconnecting forever).
    while_streaming(master, slave, 12_000, lambda: slave.terminate(timeout_s=15))
    assert slave.proc.returncode == 0
    assert "stopped cleanly" in slave.log()
