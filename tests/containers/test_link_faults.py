"""``TidemqCluster``'s per-link faults on real containers: a partition between a SYNC_MASTER and
its slave (both still reaching the nameserver) degrades sync sends without losing one, and
healing restores them; a slow link between them slows each sync send by its round trip, and
only while it lasts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest

from tests.waiting import wait_until
from tidemq import SendStatus
from tidemq.producer import Producer
from tidemq.testing import TidemqCluster

DELAY_MS = 150


@pytest.fixture(scope="module")
def cluster() -> Iterator[TidemqCluster]:
    config = {"replication": {"sync_timeout_ms": 1000}}
    with TidemqCluster(
        master_role="SYNC_MASTER", slaves=1, nameservers=1, broker_config=config
    ) as c:
        with c.admin() as admin:
            admin.create_topic("orders", queues=1)
        yield c


def sync_send_s(producer: Producer, count: int) -> float:
    """The median time of ``count`` sends, each acknowledged by the slave too."""
    times = []
    for _ in range(count):
        began = time.monotonic()
        assert producer.send("orders", b"x").status is SendStatus.SEND_OK
        times.append(time.monotonic() - began)
    return statistics.median(times)


def test_a_partition_between_master_and_slave_degrades_sync_sends_until_healed(
    cluster: TidemqCluster,
) -> None:
    master, slave = cluster.master(), cluster.slaves()[0]
    with cluster.producer() as producer:
        assert producer.send("orders", b"before").status is SendStatus.SEND_OK
        cluster.partition(master, slave)
        try:
            r = producer.send("orders", b"stored on the master only")
            assert r.status in (SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE)
            # Only their link is cut: the nameserver still routes both.
            assert cluster.routed_brokers() >= {"broker-a/0", "broker-a/1"}
        finally:
            cluster.heal()
        wait_until(
            lambda: producer.send("orders", b"x").status is SendStatus.SEND_OK,
            30,
            "sync sends acknowledged by the slave again",
        )
    cluster.wait_synced(30)


def test_a_slow_link_slows_sync_sends_by_its_round_trip_while_it_lasts(
    cluster: TidemqCluster,
) -> None:
    master, slave = cluster.master(), cluster.slaves()[0]
    with cluster.producer() as producer:
        sync_send_s(producer, 5)  # connections open, the slave caught up
        before = sync_send_s(producer, 10)
        cluster.delay(master, slave, DELAY_MS)
        try:
            slow = sync_send_s(producer, 7)
        finally:
            cluster.delay(master, slave, 0)
        after = sync_send_s(producer, 10)
    print(f"sync send median: {before * 1000:.0f} ms, slow link {slow * 1000:.0f} ms, "
          f"after {after * 1000:.0f} ms")  # fmt: skip
    # The master waits for the data to reach the slave and its answer to come back.
    assert slow >= 2 * DELAY_MS / 1000
    assert before < DELAY_MS / 1000 and after < DELAY_MS / 1000
