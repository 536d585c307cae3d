"""Helpers for automatic-failover tests: a broker group of real processes on a real ZooKeeper,
electing its own master, and a history of what producers were told.

``Group`` starts brokers with ``--failover auto`` (ids 1..n, SYNC_MASTER when elected) and a
short ZooKeeper session, finds who is master from the brokers' own status, and kills, stops or
restarts them by id. ``History`` records every send's answer (who acknowledged it, under which
epoch, and when) so a check after the faults can hold the cluster to what it promised.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

import tidemq
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.replicas import commitlog, max_offset, pull_queue, status, topic_names
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tests.workers import Worker, WorkerFailed, finish_all

SESSION_MS = 2_000
LEASE_MS = 1_000
ISR_LAG_MS = 4_000


@dataclass
class Group:
    start_broker: StartBroker
    zk: ZooKeeperServer
    root: str
    name: str = "broker-a"
    extra: tuple[str, ...] = ()
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    flags: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def start(self, broker_id: int, *flags: str) -> BrokerProcess:
        """Start (or restart, on the same store, port and flags) broker ``broker_id``."""
        flags = self.flags.setdefault(broker_id, flags)
        b = self.start_broker(
            "--broker-name",
            self.name,
            "--broker-id",
            str(broker_id),
            "--role",
            "SYNC_MASTER",
            "--failover",
            "auto",
            "--zk",
            self.zk.hosts,
            "--zk-root",
            self.root,
            "--zk-session-timeout-ms",
            str(SESSION_MS),
            "--failover-lease-ms",
            str(LEASE_MS),
            "--isr-max-lag-ms",
            str(ISR_LAG_MS),
            "--ha-sync-timeout-ms",
            "2000",
            "--ha-report-interval-ms",
            "1000",
            *self.extra,
            *flags,
            store=f"{self.name}-{broker_id}",
            port=self.ports.get(broker_id),
        )
        self.ports[broker_id] = int(b.address.rsplit(":", 1)[1])
        self.brokers[broker_id] = b
        return b

    def routed(
        self,
        start_nameserver: StartNameServer,
        topic: str,
        queues: int,
        *flags: str,
        own_flags: Mapping[int, Sequence[str]] | None = None,
    ) -> NameServerProcess:
        """A nameserver on this group's ZooKeeper and brokers 1-3 (with ``flags``, and each
        with its ``own_flags``), elected, all in sync, every one knowing ``topic``."""
        ns = start_nameserver("--zk", self.zk.hosts, "--zk-root", self.root)
        for i in (1, 2, 3):
            self.start(i, *flags, *(own_flags or {}).get(i, ()))
        self.master()
        with tidemq.Admin(ns.address) as admin:
            wait_until(lambda: bool(admin.masters()), 20, "the master in the routes")
            admin.create_topic(topic, queues=queues)
        self.wait_isr({1, 2, 3})
        # Topic configs reach slaves with the config sync (every 3 s).
        wait_until(
            lambda: all(topic in topic_names(b) for b in self.brokers.values()),
            20,
            f"every broker to know {topic}",
        )
        return ns

    def live(self) -> dict[int, BrokerProcess]:
        return {i: b for i, b in self.brokers.items() if b.proc.poll() is None}

    def failover(self, broker_id: int) -> Any:
        return status(self.brokers[broker_id]).failover

    def master(self, timeout_s: float = 30, not_id: int | None = None) -> int:
        """The id of the broker that is master and acknowledging, as every live broker agrees."""
        found: list[int] = []

        def agreed() -> bool:
            views = {}
            for i, b in self.live().items():
                if i == not_id and b.proc.poll() is None:
                    continue
                try:
                    views[i] = status(b).failover
                except grpc.RpcError:
                    return False
            masters = [i for i, f in views.items() if f.role != "SLAVE" and f.acknowledging]
            if len(masters) != 1 or masters[0] == not_id:
                return False
            m = masters[0]
            epoch = views[m].group_epoch
            if any(f.master_id != m or f.group_epoch != epoch for f in views.values()):
                return False
            found.append(m)
            return True

        wait_until(agreed, timeout_s, "one acknowledging master every live broker follows")
        return found[-1]

    def wait_isr(self, members: set[int], timeout_s: float = 30) -> None:
        m = self.master()
        wait_until(
            lambda: set(self.failover(m).isr) == members,
            timeout_s,
            f"the in-sync set to be {sorted(members)}",
        )

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def freeze(self, broker_id: int) -> None:
        os.killpg(self.brokers[broker_id].proc.pid, signal.SIGSTOP)

    def thaw(self, broker_id: int) -> None:
        os.killpg(self.brokers[broker_id].proc.pid, signal.SIGCONT)

    def thaw_all(self) -> None:
        for i, b in self.brokers.items():
            if b.proc.poll() is None:
                self.thaw(i)

    def wait_converged(self, timeout_s: float = 60) -> None:
        """Every live broker's CommitLog equals the master's, byte for byte."""
        m = self.brokers[self.master()]
        want = max_offset(m)
        others = [b for i, b in self.live().items() if b is not m]
        wait_until(
            lambda: all(max_offset(b) == want for b in others),
            timeout_s,
            f"every replica at the master's {want}",
        )
        mine = commitlog(m)
        for b in others:
            theirs = commitlog(b)
            for name, data in mine.items():
                assert theirs.get(name) == data, f"{b.store_dir.name}: commitlog/{name} differs"


@pytest.fixture(name="group")
def group_fixture(
    start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str
) -> Iterator[Group]:
    """``group``: a ``Group`` on the session's ZooKeeper (a test module imports this fixture)."""
    g = Group(start_broker, zookeeper, zk_root)
    yield g
    g.thaw_all()  # a frozen broker cannot obey the SIGTERM that stops it


@dataclass(frozen=True)
class Answer:
    body: str
    key: str
    ok: bool
    status: str
    epoch: int
    broker: str
    queue_id: int
    queue_offset: int
    at: float  # time.monotonic() when the answer arrived


class History:
    """Producers' answers; appended from several threads."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self._lock = threading.Lock()

    def record(self, a: Answer) -> None:
        with self._lock:
            self.answers.append(a)

    def acknowledged(self) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.ok]


class Producers:
    """``n`` threads each sending its own key's numbered messages, one at a time, until
    stopped; every answer goes to the history."""

    def __init__(self, nameserver: NameServerProcess, topic: str, history: History, n: int = 2):
        self.nameserver = nameserver
        self.topic = topic
        self.history = history
        self._stop = threading.Event()
        self._go = threading.Event()  # cleared: the threads hold their next send
        self._go.set()
        self._busy = 0
        self._busy_lock = threading.Lock()
        # An unexpected exception in a thread fails the test (at the next wait, or at exit).
        self._threads = [
            Worker(functools.partial(self._run, f"p{i}"), name=f"producer-p{i}") for i in range(n)
        ]
        self.errors: list[str] = []

    def __enter__(self) -> Producers:
        for t in self._threads:
            t.start()
        return self

    def pause(self) -> None:
        """Hold every thread before its next send, and wait until none has one in flight."""
        with self._busy_lock:
            self._go.clear()
        wait_until(
            lambda: self.healthy() and self._busy == 0, 30, "the producers' sends in flight to end"
        )

    def resume(self) -> None:
        self._go.set()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._go.set()
        finish_all(self._threads)

    def healthy(self) -> bool:
        """True while every producer thread runs; the first one's exception once one failed."""
        return all(t.check() for t in self._threads)

    def _run(self, key: str) -> None:
        i = 0
        with tidemq.Producer(self.nameserver.address, send_timeout_ms=5000) as producer:
            while not self._stop.is_set():
                with self._busy_lock:
                    going = self._go.is_set()
                    self._busy += going
                if not going:
                    self._go.wait(0.1)
                    continue
                body = f"{key}:{i}"
                try:
                    r = producer.send(self.topic, body, sharding_key=key)
                except tidemq.errors.TidemqError as e:
                    self.errors.append(f"{body}: {e}")
                    self.history.record(
                        Answer(body, key, False, type(e).__name__, 0, "", -1, -1, time.monotonic())
                    )
                else:
                    self.history.record(
                        Answer(
                            body,
                            key,
                            r.status is tidemq.SendStatus.SEND_OK,
                            r.status.name,
                            r.epoch,
                            r.broker_address,
                            r.queue_id,
                            r.queue_offset,
                            time.monotonic(),
                        )
                    )
                finally:
                    with self._busy_lock:
                        self._busy -= 1
                i += 1

    def wait_acknowledged(self, more_than: int, timeout_s: float = 60) -> None:
        try:
            wait_until(
                lambda: self.healthy() and len(self.history.acknowledged()) > more_than,
                timeout_s,
                f"more than {more_than} acknowledged sends",
            )
        except WorkerFailed:
            raise
        except AssertionError as e:
            last = [(a.body, a.status) for a in self.history.answers[-5:]]
            raise AssertionError(f"{e}; last answers {last}; errors {self.errors[-3:]}") from None


def consume_everything(b: BrokerProcess, topic: str, queues: int) -> dict[int, list[str]]:
    """Every message body in every queue of ``topic`` on broker ``b``, in queue order."""
    return {q: [body.decode() for _, body in pull_queue(b, q, topic)] for q in range(queues)}


def check_history(history: History, group: Group, topic: str, queues: int) -> None:
    """What the cluster promised, held against what it now serves:

    - every SEND_OK message is in the master's queues (none lost);
    - each key's messages are in one queue, in the order they were sent (duplicates aside);
    - no epoch was acknowledged by two brokers;
    - every live replica holds the master's CommitLog byte for byte.
    """
    acked = history.acknowledged()
    assert acked, "no send was acknowledged"
    by_epoch: dict[int, set[str]] = {}
    for a in acked:
        by_epoch.setdefault(a.epoch, set()).add(a.broker)
    shared = {e: sorted(b) for e, b in by_epoch.items() if len(b) > 1}
    assert not shared, f"epochs acknowledged by more than one broker: {shared}"
    group.wait_converged()
    served = consume_everything(group.brokers[group.master()], topic, queues)
    present = {body for bodies in served.values() for body in bodies}
    lost = sorted({a.body for a in acked} - present)
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    for bodies in served.values():
        seq: dict[str, int] = {}
        for body in bodies:
            key, _, n = body.partition(":")
            last = seq.get(key, -1)
            assert int(n) >= last, f"{key}: {n} after {last} in one queue"
            seq[key] = max(last, int(n))


Check = Callable[[], None]
