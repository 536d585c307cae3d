"""The failover fault loop: a three-broker group under concurrent SYNC_MASTER producers and a
consumer, through rounds of faults, each followed by the history check (every SEND_OK message
consumable, per-key order in its queue, no epoch acknowledged by two brokers, replicas
byte-identical).

Faults, in turn: SIGKILL the master; SIGSTOP the master past its session timeout, then SIGCONT;
SIGKILL a slave; restart ZooKeeper. CI runs one round of each (``TIDEMQ_FAULT_ROUNDS``, default 4);
``make soak`` runs many and reports how many ran clean.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.failover import SESSION_MS, Group, History, Producers, check_history
from tests.integration.zookeeper import StartZooKeeper, ZooKeeperServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

QUEUES = 4
ROUNDS = int(os.environ.get("TIDEMQ_FAULT_ROUNDS", "4"))
ROOT = "/faults"


class ConsumerThread(threading.Thread):
    """A consumer of group "audit" polling until stopped; every body it received."""

    def __init__(self, nameserver: str) -> None:
        super().__init__(daemon=True)
        self.nameserver = nameserver
        self.seen: set[str] = set()
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        with tidemq.Consumer(
            self.nameserver, group="audit", topic="orders", start_from="first"
        ) as consumer:
            while not self.stopping.is_set():
                try:
                    got = consumer.poll(max_messages=256, timeout_s=0.5)
                except tidemq.errors.TidemqError:
                    continue  # a failover in progress: the next poll tries again
                with self.lock:
                    self.seen.update(m.body.decode() for m in got)

    def has(self, bodies: set[str]) -> bool:
        with self.lock:
            return bodies <= self.seen


def kill_master(group: Group, zk: ZooKeeperServer) -> None:
    m = group.master()
    group.kill(m)
    group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=m)
    group.start(m)


def freeze_master(group: Group, zk: ZooKeeperServer) -> None:
    m = group.master()
    group.freeze(m)
    try:
        group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=m)
    finally:
        group.thaw(m)


def kill_slave(group: Group, zk: ZooKeeperServer) -> None:
    m = group.master()
    slave = next(i for i in group.brokers if i != m)
    group.kill(slave)
    group.start(slave)


def restart_zookeeper(group: Group, zk: ZooKeeperServer) -> None:
    zk.stop()
    zk.start()


FAULTS: list[Callable[[Group, ZooKeeperServer], None]] = [
    kill_master,
    freeze_master,
    kill_slave,
    restart_zookeeper,
]


@pytest.fixture
def zk(start_zookeeper: StartZooKeeper) -> ZooKeeperServer:
    return start_zookeeper()


@pytest.fixture
def group(start_broker: StartBroker, zk: ZooKeeperServer) -> Iterator[Group]:
    g = Group(start_broker, zk, ROOT)
    yield g
    g.thaw_all()


@pytest.mark.timeout(60 + 90 * ROUNDS)
def test_fault_loop_loses_nothing_acknowledged(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, "orders", QUEUES)
    history = History()
    consumer = ConsumerThread(ns.address)
    consumer.start()
    clean = 0
    try:
        with Producers(ns, "orders", history, n=3) as producers:
            for n in range(ROUNDS):
                fault = FAULTS[n % len(FAULTS)]
                producers.wait_acknowledged(len(history.acknowledged()) + 20)
                started = time.monotonic()
                fault(group, group.zk)
                group.wait_isr({1, 2, 3}, timeout_s=60)
                producers.wait_acknowledged(len(history.acknowledged()) + 20)
                producers.pause()  # replicas compare byte for byte at rest
                check_history(history, group, "orders", QUEUES)
                producers.resume()
                clean += 1
                print(f"round {n} ({fault.__name__}): clean in {time.monotonic() - started:.1f} s")
        acked = {a.body for a in history.acknowledged()}
        wait_until(lambda: consumer.has(acked), 60, "the consumer to receive every SEND_OK")
    finally:
        consumer.stopping.set()
        consumer.join(30)
        print(f"fault loop: {clean} of {ROUNDS} rounds clean, {len(history.acknowledged())} acked")
    assert clean == ROUNDS
