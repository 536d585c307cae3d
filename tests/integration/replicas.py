"""Helpers of the replication tests: a master and slaves of one broker group, registered with a
real nameserver, on 1 MiB CommitLog files so every test crosses several of them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.waiting import wait_until
from tests.workers import Worker
from tidemq.protos import broker_pb2, common_pb2

ONE_MIB_FILES = (
    '{"commitlog_file_size_bytes": 1048576, "consume_queue_entries_per_file": 10000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)
GROUP = "group-a"
# A slave of the group (broker id 1) that learns topic configs by config sync every 300 ms.
SLAVE_FLAGS = ("--role", "SLAVE", "--broker-id", "1", "--config-sync-interval-ms", "300")
QUEUES = 4
BATCH = 500


def start(
    start_broker: StartBroker,
    ns: NameServerProcess,
    store: str,
    *flags: str,
    overrides: str = ONE_MIB_FILES,
) -> BrokerProcess:
    """A broker of the group, registered with ``ns``, with ``overrides`` as its store settings."""
    return start_broker(
        "--nameserver",
        ns.address,
        "--broker-name",
        GROUP,
        "--register-interval-ms",
        "500",
        "--store-overrides",
        overrides,
        *flags,
        store=store,
    )


def start_slave(
    start_broker: StartBroker, ns: NameServerProcess, *flags: str, topic: str = "orders"
) -> BrokerProcess:
    slave = start(start_broker, ns, "slave", *SLAVE_FLAGS, *flags)
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


def dispatched_offset(b: BrokerProcess) -> int:
    st = b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    return int(st.store.dispatched_offset)


def commitlog(b: BrokerProcess) -> dict[str, bytes]:
    d = b.store_dir / "commitlog"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def wait_slave_holds(slave: BrokerProcess, end: int, timeout_s: float = 30) -> None:
    """The slave stored the CommitLog up to ``end`` and can serve reads of all of it."""
    wait_until(lambda: max_offset(slave) == end, timeout_s, f"the slave to reach {end}")
    # A slave reads from its own ConsumeQueue, which it builds after storing the bytes.
    wait_until(
        lambda: dispatched_offset(slave) == end, timeout_s, f"the slave to dispatch up to {end}"
    )


def wait_identical(master: BrokerProcess, slave: BrokerProcess, timeout_s: float = 90) -> None:
    """The slave's CommitLog files equal the master's byte for byte (no sends in flight)."""
    wait_slave_holds(slave, max_offset(master), timeout_s)
    mine, theirs = commitlog(master), commitlog(slave)
    assert sorted(theirs) == sorted(mine)
    for name, data in mine.items():
        assert theirs[name] == data, f"commitlog/{name} differs"


def pull_messages(
    b: BrokerProcess, queue_id: int, topic: str = "orders", group: str = "g"
) -> Iterator[Any]:
    """Every message in one queue, oldest first, pulled by ``group``."""
    offset = 0
    while True:
        r = b.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group=group, topic=topic, queue_id=queue_id, offset=offset, max_messages=512
            ),
            timeout=10,
        )
        if not r.messages:
            return
        yield from r.messages
        offset = r.next_offset


def log_epoch(b: BrokerProcess, queue_id: int = 0, topic: str = "orders") -> int:
    """The log epoch a pull answer of ``b`` carries."""
    request = broker_pb2.PullMessageRequest(group="g", topic=topic, queue_id=queue_id, offset=0)
    return int(b.stub().PullMessage(request, timeout=10).log_epoch)


def pull_queue(b: BrokerProcess, queue_id: int, topic: str = "orders") -> list[tuple[int, bytes]]:
    """Everything in one queue, as (queue offset, body)."""
    return [(m.queue_offset, m.body) for m in pull_messages(b, queue_id, topic)]


def assert_same_queues(master: BrokerProcess, slave: BrokerProcess, total: int) -> None:
    got = 0
    for q in range(QUEUES):
        theirs = pull_queue(slave, q)
        assert theirs == pull_queue(master, q)
        assert [o for o, _ in theirs] == list(range(len(theirs)))
        got += len(theirs)
    assert got == total


def send(b: BrokerProcess, body: bytes, queue_id: int = 0, topic: str = "orders") -> Any:
    """One message; the SendResult."""
    msg = common_pb2.Message(topic=topic, body=body, queue_id=queue_id)
    r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=[msg]), timeout=30)
    return r.results[0]


def status(b: BrokerProcess) -> Any:
    return b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)


def wait_in_sync(master: BrokerProcess, slaves: int = 1, timeout_s: float = 30) -> None:
    wait_until(
        lambda: sum(s.in_sync for s in status(master).replication.slaves) >= slaves,
        timeout_s,
        f"{slaves} slave(s) in sync with the master",
    )


def master_and_slave(
    start_broker: StartBroker, ns: NameServerProcess, *master_flags: str
) -> tuple[BrokerProcess, BrokerProcess]:
    """A master (with ``master_flags``) holding topic "orders", and its slave knowing it."""
    master = start(start_broker, ns, "master", *master_flags)
    create_topic(master)
    return master, start_slave(start_broker, ns)


def while_streaming(
    master: BrokerProcess, slave: BrokerProcess, count: int, act: Callable[[], object]
) -> None:
    """Send ``count`` messages in batches and ``act`` once the slave has passed its first file;
    returns when every batch was sent."""
    sender = Worker(functools.partial(send_batches, master, "live", count), name="sender")
    sender.start()
    try:
        wait_until(
            lambda: sender.check() and max_offset(slave) > 1 << 20,
            60,
            "the slave to pass its first file",
        )
        act()
    finally:
        sender.finish(120)
