"""Failures of whole containers: a master killed under load, a frozen slave, a nameserver cut off
the network, ZooKeeper replaced by an empty one. Clients run in the test process and reach the
containers at their addresses on the cluster network, as an application would."""

from __future__ import annotations

import threading
from typing import Any

from tests.containers.conftest import MakeCluster
from tests.waiting import wait_until
from tests.workers import Worker
from tidemq import SendStatus
from tidemq.errors import TidemqError
from tidemq.producer import SendFuture
from tidemq.testing import TidemqCluster

TOPIC = "orders"


def create_topic(cluster: TidemqCluster, queues: int = 4) -> None:
    """The topic on every master and, once config sync copied it, on every slave."""
    with cluster.admin() as admin:
        admin.create_topic(TOPIC, queues=queues)
    cluster.wait_synced(30)


def broker_status(cluster: TidemqCluster, name: str) -> dict[str, Any]:
    group, _, broker_id = name.rpartition("-")
    with cluster.admin() as admin:
        for b in admin.cluster_status()["clusters"][0]["brokers"]:
            if (b["broker_name"], b["broker_id"]) == (group, int(broker_id)):
                return dict(b)
    raise AssertionError(f"{name} is not routed")


def role_of(cluster: TidemqCluster, address: str) -> str | None:
    """A broker's failover role as it reports it, found by its address (automatic failover
    registers a broker under a different id when it is master)."""
    with cluster.admin() as admin:
        for b in admin.cluster_status()["clusters"][0]["brokers"]:
            if b["address"] == address and b.get("failover"):
                return str(b["failover"]["role"])
    return None


def consume_all(
    cluster: TidemqCluster, group: str, expected: set[str], timeout_s: float
) -> dict[str, bytes]:
    """Bodies by message id, consumed by a new group from the start until ``expected`` are in."""
    seen: dict[str, bytes] = {}
    with cluster.consumer(group, TOPIC, start_from="first") as consumer:

        def got_all() -> bool:
            polled = consumer.poll(max_messages=1000, timeout_s=0.5)
            seen.update((m.msg_id, m.body) for m in polled)
            return expected <= set(seen)

        wait_until(got_all, timeout_s, f"{len(expected)} acknowledged messages")
    return seen


def test_killed_sync_master_under_load_every_acknowledged_message_is_read_from_the_slave(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(master_role="SYNC_MASTER", slaves=1)
    create_topic(cluster)
    futures: list[SendFuture] = []
    bodies: set[bytes] = set()
    stop = threading.Event()
    in_flight = threading.BoundedSemaphore(200)

    with cluster.producer(retries=0, send_timeout_ms=3000) as producer:

        def load() -> None:
            i = 0
            while not stop.is_set():
                if not in_flight.acquire(timeout=0.1):
                    continue
                body = f"order {i}".encode()
                bodies.add(body)
                future = producer.send_async(TOPIC, body)
                future.add_done_callback(lambda _: in_flight.release())
                futures.append(future)
                i += 1

        loader = Worker(load, name="load")
        loader.start()
        try:
            wait_until(
                lambda: loader.check() and sum(f.done() for f in futures) >= 500,
                60,
                "500 sends answered",
            )
            cluster.kill(cluster.master())
            sent = len(futures)
            wait_until(
                lambda: loader.check() and len(futures) >= sent + 100, 30, "sends after the kill"
            )
        finally:
            stop.set()
            loader.finish(60)
        wait_until(lambda: all(f.done() for f in futures), 30, "every send answered")

    acked = {
        f.result().msg_id
        for f in futures
        if not f.exception() and f.result().status is SendStatus.SEND_OK
    }
    assert len(acked) >= 500, "the load ran before the kill"
    assert any(f.exception() for f in futures), "sends fail once the only master is gone"
    assert cluster.master().status == "exited"
    # SEND_OK from a SYNC_MASTER means the slave held the message: all of it reads from the slave.
    consumed = consume_all(cluster, "after-kill", acked, timeout_s=60)
    assert acked <= set(consumed)
    assert set(consumed.values()) <= bodies, "nothing consumed that was never sent"


def test_paused_slave_sends_are_stored_with_degraded_status_and_the_slave_catches_up(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(
        master_role="SYNC_MASTER",
        slaves=1,
        broker_config={
            "replication": {
                "sync_timeout_ms": 1000,
                # The master drops a silent slave's link after 3 s (reports and heartbeats must
                # come at least twice as often).
                "idle_timeout_ms": 3000,
                "report_interval_ms": 1000,
                "heartbeat_interval_ms": 1000,
            }
        },
    )
    create_topic(cluster, queues=1)
    slave = cluster.slaves()[0]
    with cluster.producer(retries=0, send_timeout_ms=10_000) as producer:
        assert producer.send(TOPIC, b"before").status is SendStatus.SEND_OK
        cluster.pause(slave)
        try:
            during = [producer.send(TOPIC, f"during {i}".encode()) for i in range(5)]
            statuses = {r.status for r in during}
            assert statuses <= {SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE}
            # Once the master gave up on the frozen slave's link, it stops waiting for it.
            wait_until(
                lambda: producer.send(TOPIC, b"probe").status is SendStatus.SLAVE_NOT_AVAILABLE,
                30,
                "SLAVE_NOT_AVAILABLE once the link is dropped",
            )
            # Stored on the master all the same: a consumer reads them while the slave sleeps.
            stored = consume_all(cluster, "during-pause", {r.msg_id for r in during}, 30)
            assert {r.msg_id for r in during} <= set(stored)
        finally:
            cluster.unpause(slave)

        def caught_up() -> bool:
            master = broker_status(cluster, cluster.master().name)["store"]
            copy = broker_status(cluster, slave.name)["store"]
            return bool(copy["commitlog_max_offset"] == master["commitlog_max_offset"])

        wait_until(caught_up, 60, "the slave to catch up with the master")
        wait_until(
            lambda: producer.send(TOPIC, b"after").status is SendStatus.SEND_OK,
            30,
            "SEND_OK again once the slave is back in sync",
        )


def test_nameserver_cut_off_clients_use_the_other(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(nameservers=2, slaves=0)
    create_topic(cluster)
    lost = cluster.nameservers[0]
    cluster.disconnect(lost)
    assert not lost.is_ready(), "nobody reaches a disconnected nameserver"
    # New clients, given both addresses, find the routes through the one left.
    with cluster.producer(retries=2) as producer:
        sent = {producer.send(TOPIC, f"m{i}".encode()).msg_id for i in range(20)}
    assert sent <= set(consume_all(cluster, "via-the-other", sent, 60))

    cluster.reconnect(lost)
    wait_until(lost.is_ready, 30, "the nameserver back on the network")
    assert cluster.routed_brokers(lost) == {"broker-a/0"}


def test_zookeeper_replaced_by_an_empty_one_brokers_register_again(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(slaves=1)
    create_topic(cluster)
    zk = cluster.zookeeper
    cluster.kill(zk)
    # The same name on the network, none of the old data: every registration is gone.
    cluster.replace(zk)
    cluster.wait_routed(60)
    for ns in cluster.nameservers:
        assert cluster.routed_brokers(ns) == {"broker-a/0", "broker-a/1"}
    with cluster.producer() as producer:
        sent = producer.send(TOPIC, b"after the new ZooKeeper")
    assert sent.status is SendStatus.SEND_OK
    assert sent.msg_id in consume_all(cluster, "after-zk", {sent.msg_id}, 30)


def test_automatic_failover_survives_a_network_partition_of_the_master(
    make_cluster: MakeCluster,
) -> None:
    """The master is cut off the network: it stops acknowledging (its ZooKeeper lease lapses),
    a slave is elected, producers follow; back on the network the old master steps down, follows
    and converges. Every SEND_OK message is read back, and no epoch has two acknowledgers."""
    cluster = make_cluster(
        master_role="SYNC_MASTER",
        failover="auto",
        slaves=2,
        broker_config={"replication": {"report_interval_ms": 1000}, "isr_max_lag_ms": 4000},
    )
    create_topic(cluster)
    old = cluster.master()
    answers: list[tuple[str, int, str]] = []  # (msg id, epoch, broker address) of each SEND_OK
    stop = threading.Event()

    def load() -> None:
        i = 0
        with cluster.producer(send_timeout_ms=5000) as producer:
            while not stop.is_set():
                try:
                    r = producer.send(TOPIC, f"order {i}".encode())
                except TidemqError:  # refused during the failover: not acknowledged
                    continue
                finally:
                    i += 1
                if r.status is SendStatus.SEND_OK:
                    answers.append((r.msg_id, r.epoch, r.broker_address))

    loader = Worker(load, name="load")
    loader.start()
    try:
        wait_until(lambda: loader.check() and len(answers) >= 100, 60, "100 acknowledged sends")
        cluster.disconnect(old)
        cut_at = len(answers)
        wait_until(
            lambda: loader.check() and any(e > answers[0][1] for _, e, _ in answers[cut_at:]),
            60,
            "a SEND_OK from a newer epoch",
        )
        new = cluster.master()
        assert new is not old
        cluster.reconnect(old)
        wait_until(
            lambda: role_of(cluster, old.address) == "SLAVE", 60, "the old master to step down"
        )
        more = len(answers)
        wait_until(
            lambda: loader.check() and len(answers) >= more + 50,
            60,
            "sends after the old master is back",
        )
    finally:
        stop.set()
        loader.finish(60)
    by_epoch: dict[int, set[str]] = {}
    for _, epoch, address in answers:
        by_epoch.setdefault(epoch, set()).add(address)
    assert all(len(b) == 1 for b in by_epoch.values()), by_epoch
    acked = {msg_id for msg_id, _, _ in answers}
    assert acked <= set(consume_all(cluster, "after-partition", acked, 90))
