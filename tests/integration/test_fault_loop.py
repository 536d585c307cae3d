"""The failover fault loop: a three-broker group under concurrent SYNC_MASTER producers and a
consumer, through rounds of faults, each followed by the history check (every SEND_OK message
consumable, per-key order in its queue, no epoch acknowledged by two brokers, replicas
byte-identical).

Faults: SIGKILL the master; SIGSTOP the master past its session timeout, then SIGCONT; SIGKILL a
slave; restart ZooKeeper. Two settings (environment variables) say how many:

- ``TIDEMQ_FAULT_ROUNDS`` (default 4): rounds in all;
- ``TIDEMQ_FAULT_MASTER_KILLS`` (default a quarter of the rounds, rounded up): how many of them
  SIGKILL the master, spread evenly; the other rounds take the other three faults in turn.

CI runs one round of each. ``make soak`` (``SOAK_ROUNDS``, ``SOAK_MASTER_KILLS``) runs 30 rounds,
20 of them master kills; each kill round also proves the load went through the failover (a
SEND_OK at a newer epoch). The end prints how many rounds of each fault ran clean.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.failover import (
    SESSION_MS,
    Answer,
    Group,
    History,
    Producers,
    check_history,
)
from tests.integration.zookeeper import StartZooKeeper, ZooKeeperServer
from tests.waiting import wait_until
from tests.workers import Worker

pytestmark = pytest.mark.integration

QUEUES = 4
ROUNDS = int(os.environ.get("TIDEMQ_FAULT_ROUNDS", "4"))
MASTER_KILLS = int(os.environ.get("TIDEMQ_FAULT_MASTER_KILLS", str(-(-ROUNDS // 4))))
ROOT = "/faults"


class ConsumerThread(Worker):
    """A consumer of group "audit" polling until stopped; every body it received. Any error but
    a TidemqError (a failover in progress) ends it and fails the test."""

    def __init__(self, nameserver: str) -> None:
        super().__init__(name="consumer")
        self.nameserver = nameserver
        self.seen: set[str] = set()
        self.newest: dict[int, int] = {}  # queue id -> the newest queue offset received
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def work(self) -> None:
        with tidemq.Consumer(
            self.nameserver, group="audit", topic="orders", start_from="first"
        ) as consumer:
            while not self.stopping.is_set():
                try:
                    got = consumer.poll(max_messages=256, timeout_s=0.5)
                except tidemq.errors.TidemqError:
                    continue  # a failover in progress: the next poll tries again
                with self.lock:
                    for m in got:
                        self.seen.add(m.body.decode())
                        newest = self.newest.get(m.queue_id, -1)
                        self.newest[m.queue_id] = max(newest, m.queue_offset)

    def has(self, bodies: set[str]) -> bool:
        self.check()
        with self.lock:
            return bodies <= self.seen

    def missing(self, acknowledged: list[Answer]) -> str:
        """What a failure says: the acknowledged sends never received, where they were stored,
        and how far the consumer got in each queue."""
        with self.lock:
            lost = [a for a in acknowledged if a.body not in self.seen]
            newest = dict(sorted(self.newest.items()))
        where = ", ".join(
            f"{a.body} (queue {a.queue_id} offset {a.queue_offset} epoch {a.epoch})"
            for a in sorted(lost, key=lambda a: (a.queue_id, a.queue_offset))[:12]
        )
        return f"{len(lost)} never received: {where}; newest offset received per queue: {newest}"


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


Fault = Callable[[Group, ZooKeeperServer], None]
OTHER_FAULTS: list[Fault] = [freeze_master, kill_slave, restart_zookeeper]


def fault_schedule(rounds: int, master_kills: int) -> list[Fault]:
    """``rounds`` faults: ``master_kills`` master kills spread evenly (the first round is one
    when there is any), the other rounds taking the other faults in turn."""
    if not 0 <= master_kills <= rounds:
        raise ValueError(f"{master_kills} master kills do not fit in {rounds} rounds")
    out: list[Fault] = []
    for n in range(rounds):
        # A kill whenever the even share of kills, rounded up, grows at this round.
        if -(-(n + 1) * master_kills // rounds) > -(-n * master_kills // rounds):
            out.append(kill_master)
        else:
            out.append(OTHER_FAULTS[(n - sum(f is kill_master for f in out)) % 3])
    return out


def newest_acknowledged_epoch(history: History) -> int:
    return max((a.epoch for a in history.acknowledged()), default=0)


def test_fault_schedule_spreads_master_kills_among_the_other_faults() -> None:
    assert fault_schedule(4, 1) == [kill_master, freeze_master, kill_slave, restart_zookeeper]
    soak = fault_schedule(30, 20)
    assert soak.count(kill_master) == 20
    assert {f: soak.count(f) for f in OTHER_FAULTS} == {
        freeze_master: 4,
        kill_slave: 3,
        restart_zookeeper: 3,
    }
    # Never two other faults in a row when kills are the majority: the kills are spread.
    assert all(kill_master in soak[i : i + 2] for i in range(29))
    with pytest.raises(ValueError, match="do not fit"):
        fault_schedule(3, 4)


def test_make_soak_runs_at_least_20_master_kills() -> None:
    """What ``make soak`` runs by default: its rounds and kills, read from the Makefile."""
    make = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    settings = dict(re.findall(r"^(SOAK_\w+) \?= (\d+)$", make, re.MULTILINE))
    recipe = make[make.index("\nsoak:") :].split("\n\n", 1)[0]
    assert "TIDEMQ_FAULT_ROUNDS=$(SOAK_ROUNDS)" in recipe
    assert "TIDEMQ_FAULT_MASTER_KILLS=$(SOAK_MASTER_KILLS)" in recipe
    assert "tests/integration/test_fault_loop.py" in recipe
    schedule = fault_schedule(int(settings["SOAK_ROUNDS"]), int(settings["SOAK_MASTER_KILLS"]))
    assert schedule.count(kill_master) >= 20
    assert set(OTHER_FAULTS) <= set(schedule), "the soak also runs every other fault"


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
    schedule = fault_schedule(ROUNDS, MASTER_KILLS)
    ns = group.routed(start_nameserver, "orders", QUEUES)
    history = History()
    consumer = ConsumerThread(ns.address)
    consumer.start()
    clean: Counter[str] = Counter()
    try:
        with Producers(ns, "orders", history, n=3) as producers:
            for n, fault in enumerate(schedule):
                producers.wait_acknowledged(len(history.acknowledged()) + 20)
                epoch = newest_acknowledged_epoch(history)
                started = time.monotonic()
                fault(group, group.zk)
                group.wait_isr({1, 2, 3}, timeout_s=60)
                producers.wait_acknowledged(len(history.acknowledged()) + 20)
                if fault is kill_master:
                    # The load ran through the failover: the new master acknowledged some of it.
                    assert newest_acknowledged_epoch(history) > epoch, f"round {n}: no new epoch"
                producers.pause()  # replicas compare byte for byte at rest
                check_history(history, group, "orders", QUEUES)
                producers.resume()
                clean[fault.__name__] += 1
                print(f"round {n} ({fault.__name__}): clean in {time.monotonic() - started:.1f} s")
        acknowledged = history.acknowledged()
        acked = {a.body for a in acknowledged}
        try:
            wait_until(lambda: consumer.has(acked), 60, "the consumer to receive every SEND_OK")
        except AssertionError as e:
            raise AssertionError(f"{e}: {consumer.missing(acknowledged)}") from None
    finally:
        consumer.stopping.set()
        consumer.finish(30)
        kinds = ", ".join(f"{f}: {n}" for f, n in sorted(clean.items()))
        print(
            f"fault loop: {clean.total()} of {ROUNDS} rounds clean ({kinds}); "
            f"{clean['kill_master']} of {MASTER_KILLS} master kills under SYNC_MASTER load "
            f"clean; {len(history.acknowledged())} acknowledged"
        )
    assert clean["kill_master"] == MASTER_KILLS
    assert clean.total() == ROUNDS
