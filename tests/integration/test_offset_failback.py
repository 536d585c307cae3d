"""RocketMQ #1094 in full: the master of a group dies, its slave serves, consumers consume and
commit there, the master returns. No committed offset moves backwards, as any broker of the
group answers it while this happens, nor for a consumer that starts afterwards; the offsets
committed on the slave reach the returned master (config sync hands them back, by version,
without comparing the two machines' clocks).

Static master/slave here; under automatic failover, with a real ZooKeeper and an old master
whose wall clock is an hour ahead, below."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

import pytest

import tidemq
from tests.faults import preload_env
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.failover import Group
from tests.integration.offset_watch import OffsetWatch, consume
from tests.integration.replicas import (
    create_topic,
    max_offset,
    start,
    start_slave,
    status,
    topic_names,
    wait_slave_holds,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

QUEUES = 4
PER_QUEUE = 40
SYNC_MS = 300  # the slaves' config sync interval
HOUR_MS = 3_600_000
FAST = {
    "start_from": "first",
    "auto_commit_interval_ms": 200,
    "rebalance_interval_ms": 500,
    "heartbeat_interval_ms": 500,
    "long_poll_ms": 500,
}


def fill(b: BrokerProcess, prefix: str, per_queue: int) -> None:
    for q in range(QUEUES):
        msgs = [
            common_pb2.Message(topic="orders", body=f"{prefix}-{q}-{i}".encode(), queue_id=q)
            for i in range(per_queue)
        ]
        r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
        assert {x.status for x in r.results} == {broker_pb2.SEND_OK}


def per_queue_at_least(n: int) -> Callable[[list[tidemq.ReceivedMessage]], bool]:
    def enough(got: list[tidemq.ReceivedMessage]) -> bool:
        counts = [0] * QUEUES
        for m in got:
            counts[m.queue_id] += 1
        return min(counts) >= n

    return enough


def sync_rounds(slave: BrokerProcess, rounds: int) -> None:
    """Until the slave has finished ``rounds`` more config syncs."""
    seen = {status(slave).replication.last_config_sync_ms}

    def more() -> bool:
        seen.add(status(slave).replication.last_config_sync_ms)
        return len(seen) > rounds

    wait_until(more, 30, f"{rounds} more config syncs")


def a_restarted_consumer_resumes_after_everything_committed(
    ns: NameServerProcess, producer_target: BrokerProcess
) -> None:
    """New messages after the old ones; a consumer of the group that starts now gets exactly
    the new ones: an offset that had moved back would hand it old ones first."""
    fill(producer_target, "new", 5)
    with tidemq.Consumer(ns.address, group="g", topic="orders", **FAST) as c:
        got = consume(c, per_queue_at_least(5), 60)
        got += c.poll(max_messages=64, timeout_s=1.0)
    old = sorted({m.body.decode() for m in got if not m.body.startswith(b"new-")})
    assert not old, f"a restarted consumer was handed {len(old)} consumed messages again: {old[:5]}"
    assert len(got) == 5 * QUEUES


def test_offsets_committed_on_the_slave_reach_the_returned_master_and_never_move_back(
    start_broker: StartBroker, nameserver: NameServerProcess
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)  # config sync every 300 ms
    fill(master, "old", PER_QUEUE)
    wait_slave_holds(slave, max_offset(master))
    end = [PER_QUEUE] * QUEUES

    with OffsetWatch("g", "orders", QUEUES) as watch:
        watch.addresses.update(master=master.address, slave=slave.address)
        # master_retry_ms: once the master fails, this consumer stays on the slave to the end,
        # so the returned master can learn its commits only from the slave.
        with tidemq.Consumer(
            nameserver.address, group="g", topic="orders", master_retry_ms=120_000, **FAST
        ) as c:
            # A few at a time: about a quarter of each queue is consumed before the kill.
            got = consume(c, per_queue_at_least(PER_QUEUE // 4), 60, max_messages=QUEUES)
            c.commit()
            wait_until(
                lambda: (
                    None not in watch.latest("master")
                    and watch.latest("slave") == watch.latest("master")
                ),
                30,
                "the slave to hold the master's offsets",
            )
            before = watch.latest("master")
            master.kill()
            consume(c, per_queue_at_least(PER_QUEUE), 60, got)
        # Closed: its last commits went to the slave, the only broker it could reach.
        wait_until(lambda: watch.latest("slave") == end, 30, "the slave to hold every commit")
        assert watch.latest("master") == before and before != end

        master = start(start_broker, nameserver, "master")
        watch.addresses["master"] = master.address
        wait_until(
            lambda: watch.latest("master") == end,
            30,
            f"the returned master to take the offsets committed on the slave (it says "
            f"{watch.latest('master')}, the slave {watch.latest('slave')})",
        )
        sync_rounds(slave, 3)
        assert watch.latest("master") == end and watch.latest("slave") == end
    assert not watch.backwards(), watch.backwards()
    assert watch.highest() == end
    a_restarted_consumer_resumes_after_everything_committed(nameserver, master)


def committed_on(b: BrokerProcess, group: str) -> list[int | None]:
    offsets: list[int | None] = []
    for q in range(QUEUES):
        r = b.stub().QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(group=group, topic="orders", queue_id=q),
            timeout=10,
        )
        offsets.append(int(r.offset) if r.found else None)
    return offsets


def test_a_commit_its_master_cannot_take_lands_on_the_slave_at_once(
    start_broker: StartBroker, nameserver: NameServerProcess
) -> None:
    """The master hangs (SIGSTOP) just after a consumer read everything, before any read of
    the consumer has failed there: the commit that times out on the master goes on to the
    slave within the same ``commit()``, instead of being dropped until some later commit."""
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
    fill(master, "m", 10)
    wait_slave_holds(slave, max_offset(master))
    config = {**FAST, "auto_commit": False, "long_poll_ms": 30_000}
    with tidemq.Consumer(
        nameserver.address, group="g", topic="orders", master_retry_ms=120_000, **config
    ) as c:
        consume(c, per_queue_at_least(10), 60)
        os.kill(master.proc.pid, signal.SIGSTOP)
        try:
            c.commit()
            assert committed_on(slave, "g") == [10] * QUEUES
        finally:
            os.kill(master.proc.pid, signal.SIGCONT)


@pytest.fixture
def group(start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(start_broker, zookeeper, zk_root, extra=("--config-sync-interval-ms", str(SYNC_MS)))
    yield g
    g.thaw_all()


@contextlib.contextmanager
def clock_ahead(monkeypatch: pytest.MonkeyPatch, ms: int) -> Iterator[None]:
    """Brokers started inside read a wall clock ``ms`` ahead of this machine's."""
    env = preload_env("wallclock_skew", TIDEMQ_CLOCK_SKEW_MS=str(ms))
    with monkeypatch.context() as m:
        for name in ("LD_PRELOAD", "TIDEMQ_CLOCK_SKEW_MS"):
            m.setenv(name, env[name])
        yield


def test_under_automatic_failover_an_old_master_whose_clock_is_ahead_takes_the_new_offsets(
    group: Group,
    start_nameserver: StartNameServer,
    zookeeper: ZooKeeperServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first master's wall clock is an hour ahead. It dies, another broker is elected at a
    new epoch and consumers commit there; the old master returns as a slave. Every broker ends
    with the newer offsets (a merge by commit time would keep the old master's, stamped an hour
    "later", on it and on the other slave), and none moves backwards meanwhile."""
    ns = start_nameserver("--zk", zookeeper.hosts, "--zk-root", group.root)
    with clock_ahead(monkeypatch, HOUR_MS):
        group.start(1)
    first = group.master()
    assert first == 1
    for i in (2, 3):
        group.start(i)
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "the master in the routes")
        admin.create_topic("orders", queues=QUEUES)
    group.wait_isr({1, 2, 3})
    wait_until(
        lambda: all("orders" in topic_names(b) for b in group.brokers.values()),
        20,
        "every broker to know the topic",
    )
    fill(group.brokers[first], "old", PER_QUEUE)
    group.wait_converged()
    end = [PER_QUEUE] * QUEUES

    def agreed() -> bool:
        views = {tuple(watch.latest(str(i))) for i in group.brokers}
        return len(views) == 1 and None not in watch.latest(str(first))

    with OffsetWatch("g", "orders", QUEUES) as watch:
        watch.addresses.update({str(i): b.address for i, b in group.brokers.items()})
        with tidemq.Consumer(ns.address, group="g", topic="orders", **FAST) as c:
            # A few at a time: about a quarter of each queue is consumed before the kill.
            got = consume(c, per_queue_at_least(PER_QUEUE // 4), 60, max_messages=QUEUES)
            c.commit()
            wait_until(agreed, 30, "every broker to hold the master's offsets")
            before = watch.latest(str(first))
            group.kill(first)
            second = group.master(timeout_s=30, not_id=first)
            consume(c, per_queue_at_least(PER_QUEUE), 60, got)
        wait_until(lambda: watch.latest(str(second)) == end, 30, "the new master to hold them")
        assert watch.latest(str(first)) == before and before != end

        with clock_ahead(monkeypatch, HOUR_MS):
            group.start(first)
        wait_until(
            lambda: all(watch.latest(str(i)) == end for i in group.live()),
            30,
            "every broker, the old master too, to hold the new master's offsets "
            + str({i: watch.latest(str(i)) for i in group.live()}),
        )
        sync_rounds(group.brokers[first], 3)
        for i in group.live():
            assert watch.latest(str(i)) == end, f"broker {i}: {watch.latest(str(i))}"
    assert not watch.backwards(), watch.backwards()
    assert watch.highest() == end
    a_restarted_consumer_resumes_after_everything_committed(ns, group.brokers[second])
