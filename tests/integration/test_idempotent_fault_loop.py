"""Idempotent producers through faults (docs/production.md): a three-broker group on ZooKeeper
under idempotent producers that keep several sends in flight, while the master is SIGKILLed
(an automatic failover) and then frozen with SIGSTOP past its session (sends time out and are
retried; a new master takes over; the old one comes back as a slave).

Held against what the consumers can read afterwards: no message from an idempotent producer is
stored twice, none that was acknowledged is lost, and the producers did retry (the faults were
felt)."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import tidemq
from tests.integration.conftest import (
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.integration.failover import SESSION_MS, Group, consume_everything
from tests.integration.receiving import scrape
from tests.integration.zookeeper import StartZooKeeper, ZooKeeperServer
from tests.waiting import wait_until
from tests.workers import Worker, finish_all

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 4
WINDOW = 8  # sends each producer keeps in flight


class IdempotentLoad:
    """``n`` producer threads, each sending its own numbered bodies WINDOW at a time."""

    def __init__(self, ns: NameServerProcess, n: int = 2) -> None:
        self.ns = ns
        self.acked: set[str] = set()
        self.failed: set[str] = set()
        self.failed_requests = 0
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            Worker(functools.partial(self._run, f"p{i}"), name=f"producer-p{i}") for i in range(n)
        ]

    def __enter__(self) -> IdempotentLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        finish_all(self.threads)

    def _run(self, key: str) -> None:
        i = 0
        with tidemq.Producer(
            self.ns.address, send_timeout_ms=25_000, attempt_timeout_ms=1_000
        ) as producer:
            while not self.stopping.is_set():
                bodies = [f"{key}:{i + k}" for k in range(WINDOW)]
                futures = [producer.send_async(TOPIC, b) for b in bodies]
                for body, f in zip(bodies, futures, strict=True):
                    try:
                        ok = f.result(timeout=60).ok
                    except tidemq.errors.TidemqError as e:
                        ok = False
                        with self.lock:
                            self.errors[f"{type(e).__name__}: {str(e)[:80]}"] += 1
                    with self.lock:
                        (self.acked if ok else self.failed).add(body)
                i += WINDOW
            with self.lock:
                self.failed_requests += producer.stats.failed_requests

    def acknowledged(self) -> int:
        assert all(t.check() for t in self.threads)
        with self.lock:
            return len(self.acked)

    def wait_acknowledged(self, more: int, timeout_s: float = 60) -> None:
        want = self.acknowledged() + more
        wait_until(lambda: self.acknowledged() >= want, timeout_s, f"{want} acknowledged sends")


@pytest.fixture
def zk(start_zookeeper: StartZooKeeper) -> ZooKeeperServer:
    return start_zookeeper()


@pytest.fixture
def group(start_broker: StartBroker, zk: ZooKeeperServer) -> Iterator[Group]:
    g = Group(start_broker, zk, "/idempotent")
    yield g
    g.thaw_all()


@pytest.mark.timeout(180)
def test_idempotent_producers_store_each_message_once_through_kills_and_freezes(
    group: Group, start_nameserver: StartNameServer
) -> None:
    metrics = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    ns = group.routed(
        start_nameserver,
        TOPIC,
        QUEUES,
        own_flags={i: ("--metrics-listen", address) for i, address in metrics.items()},
    )
    started = time.monotonic()
    with IdempotentLoad(ns) as load:
        load.wait_acknowledged(200)
        # Both slaves stopped for longer than an attempt (not long enough to leave the
        # in-sync set): the master stores and waits for them, the attempt times out, and
        # its retry reaches the master holding the message already.
        m = group.master()
        slaves = [i for i in group.brokers if i != m]
        for i in slaves:
            group.freeze(i)
        time.sleep(1.5)  # the fault itself lasts this long, it is not a wait for a result
        for i in slaves:
            group.thaw(i)
        load.wait_acknowledged(200)
        duplicates_answered = scrape(metrics[m]).get(("tidemq_idempotent_duplicates_total", ()), 0)
        # SIGKILL the master: requests in flight fail, their retries go to the new master.
        m = group.master()
        group.kill(m)
        group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=m)
        load.wait_acknowledged(200)
        group.start(m)
        group.wait_isr({1, 2, 3}, timeout_s=60)
        # SIGSTOP the master past its session: attempts time out and are retried, and some
        # reach the new master after the frozen one stored (and replicated) them.
        m = group.master()
        group.freeze(m)
        try:
            group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=m)
            load.wait_acknowledged(200)
        finally:
            group.thaw(m)
        group.wait_isr({1, 2, 3}, timeout_s=60)
        load.wait_acknowledged(100)
    print(f"faults and load took {time.monotonic() - started:.1f} s")
    group.wait_converged()
    served = consume_everything(group.brokers[group.master()], TOPIC, QUEUES)
    counts = Counter(body for bodies in served.values() for body in bodies)
    duplicates = sorted(b for b, n in counts.items() if n > 1)
    lost = sorted(load.acked - counts.keys())
    print(
        f"{len(load.acked)} acknowledged, {len(load.failed)} failed, {len(counts)} stored, "
        f"{load.failed_requests} failed requests (retried), {duplicates_answered:.0f} retries "
        f"answered as duplicates; errors {load.errors.most_common(5)}"
    )
    assert load.failed_requests > 0, "the faults were not felt: no request failed"
    assert duplicates_answered > 0, "no retry reached a master that held its message"
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert not duplicates, f"{len(duplicates)} messages stored twice, e.g. {duplicates[:5]}"
