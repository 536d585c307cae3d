"""Replication over real processes: a master and its slave, registered with a real nameserver,
with 1 MiB CommitLog files so every test crosses several of them."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from protos import broker_pb2, common_pb2, replication_pb2, replication_pb2_grpc
from protos.errors import detail_from_metadata
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ONE_MIB_FILES = (
    '{"commitlog_file_size_bytes": 1048576, "consume_queue_entries_per_file": 10000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)
GROUP = "group-a"
QUEUES = 4
BATCH = 500


def start(
    start_broker: StartBroker, ns: NameServerProcess, store: str, *flags: str
) -> BrokerProcess:
    return start_broker(
        "--nameserver",
        ns.address,
        "--broker-name",
        GROUP,
        "--register-interval-ms",
        "500",
        "--store-overrides",
        ONE_MIB_FILES,
        *flags,
        store=store,
    )


def start_slave(
    start_broker: StartBroker, ns: NameServerProcess, *flags: str, topic: str = "orders"
) -> BrokerProcess:
    slave = start(
        start_broker,
        ns,
        "slave",
        "--role",
        "SLAVE",
        "--broker-id",
        "1",
        "--config-sync-interval-ms",
        "300",
        *flags,
    )
    # Topic configs come from the master by config sync, as the data comes by replication.
    wait_until(lambda: topic in topic_names(slave), 30, f"the slave to learn topic {topic!r}")
    return slave


def topic_names(b: BrokerProcess) -> set[str]:
    r = b.stub().ListTopics(broker_pb2.ListTopicsRequest(), timeout=10)
    return {t.topic for t in r.topics}


def create_topic(b: BrokerProcess, topic: str = "orders") -> None:
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES
            )
        ),
        timeout=10,
    )


def send_batches(b: BrokerProcess, prefix: str, count: int, topic: str = "orders") -> None:
    for start_at in range(0, count, BATCH):
        n = min(BATCH, count - start_at)
        msgs = [
            common_pb2.Message(
                topic=topic,
                body=f"{prefix}-{start_at + i}-".encode() * 40,
                queue_id=(start_at // BATCH) % QUEUES,
            )
            for i in range(n)
        ]
        r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
        assert {x.status for x in r.results} == {broker_pb2.SEND_OK}


def max_offset(b: BrokerProcess) -> int:
    st = b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    return int(st.store.commitlog_max_offset)


def commitlog(b: BrokerProcess) -> dict[str, bytes]:
    d = b.store_dir / "commitlog"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def wait_identical(master: BrokerProcess, slave: BrokerProcess, timeout_s: float = 90) -> None:
    """The slave's CommitLog files equal the master's byte for byte (no sends in flight)."""
    want = max_offset(master)
    wait_until(lambda: max_offset(slave) == want, timeout_s, f"the slave to reach {want}")
    mine, theirs = commitlog(master), commitlog(slave)
    assert sorted(theirs) == sorted(mine)
    for name, data in mine.items():
        assert theirs[name] == data, f"commitlog/{name} differs"


def pull_queue(b: BrokerProcess, queue_id: int, topic: str = "orders") -> list[tuple[int, bytes]]:
    """Everything in one queue, as (queue offset, body)."""
    got: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        r = b.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group="g", topic=topic, queue_id=queue_id, offset=offset, max_messages=512
            ),
            timeout=10,
        )
        if not r.messages:
            return got
        got += [(m.queue_offset, m.body) for m in r.messages]
        offset = r.next_offset


def assert_same_queues(master: BrokerProcess, slave: BrokerProcess, total: int) -> None:
    got = 0
    for q in range(QUEUES):
        theirs = pull_queue(slave, q)
        assert theirs == pull_queue(master, q)
        assert [o for o, _ in theirs] == list(range(len(theirs)))
        got += len(theirs)
    assert got == total


def test_async_master_streams_10000_messages_to_its_slave(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
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
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
    sender = threading.Thread(target=send_batches, args=(master, "live", 12_000))
    sender.start()
    try:
        wait_until(lambda: max_offset(slave) > 1 << 20, 60, "the slave to pass its first file")
        slave.kill()
    finally:
        sender.join(120)
    assert not sender.is_alive()
    slave = start_slave(start_broker, nameserver)
    wait_identical(master, slave)
    assert_same_queues(master, slave, 12_000)
