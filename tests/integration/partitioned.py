"""An automatic-failover broker group whose every process has a network namespace of its own
(``netns``), so that a test can cut any pair: ZooKeeper (node ``zk``), the nameserver (``ns``),
the brokers (``broker-a-<id>``, named after their stores) and the producing clients
(``clients``, a ``partition_clients`` process).

``Cluster.start_broker`` and ``Cluster.start_nameserver`` have the signatures of the
``start_broker`` / ``start_nameserver`` fixtures, so ``failover.Group`` drives these brokers as
it drives loopback ones, and ``failover.check_history`` judges what the clients were told.
Every process is stopped by its PID at the end (and its log printed when the test failed)
before the namespaces are deleted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import (
    SMALL_STORE,
    BrokerProcess,
    NameServerProcess,
    ServiceProcess,
    stop_all,
)
from tests.integration.failover import Answer, History
from tests.integration.netns import Network, Node
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until

BROKER_PORT = 10911  # every node has an address of its own: the ports need not differ
NAMESERVER_PORT = 9876
ZOOKEEPER_PORT = 2181
CLIENTS_STOP_S = 30.0


def spawn_in(node: Node, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            [*node.launcher, sys.executable, *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@dataclass
class Clients:
    """The producing clients' process and the answers it has written so far."""

    proc: subprocess.Popen[bytes]
    out: Path
    log_path: Path
    history: History = field(default_factory=History)
    started: dict[str, float] = field(default_factory=dict)  # body: when its send was called
    _read: int = 0  # bytes of ``out`` already in the history

    def poll(self) -> History:
        """The history, with every answer written since the last call."""
        data = self.out.read_bytes()
        end = data.rfind(b"\n", self._read) + 1  # only whole lines: one may be half-written
        for line in data[self._read : end].splitlines():
            answer = json.loads(line)
            self.started[answer["body"]] = answer.pop("started")
            self.history.record(Answer(**answer))
        self._read = max(self._read, end)
        if self.proc.poll() is not None and self.proc.returncode != 0:
            raise AssertionError(f"the clients exited with {self.proc.returncode}: {self.log()}")
        return self.history

    def acknowledged(self) -> list[Answer]:
        return self.poll().acknowledged()

    def acknowledged_sends_started_after(self, t: float) -> list[Answer]:
        """SEND_OK answers to sends called after monotonic time ``t``: whoever acknowledged
        one decided to after ``t`` (an answer's arrival time would also count a decision made
        before ``t`` and delivered late)."""
        return [a for a in self.acknowledged() if self.started[a.body] > t]

    def wait_acknowledged(self, more_than: int, timeout_s: float = 30) -> None:
        try:
            wait_until(
                lambda: len(self.acknowledged()) > more_than,
                timeout_s,
                f"more than {more_than} acknowledged sends",
            )
        except AssertionError as e:
            last = [(a.body, a.status, a.broker) for a in self.history.answers[-5:]]
            raise AssertionError(f"{e}; last answers {last}") from None

    def stop(self) -> History:
        """SIGTERM; each producer ends after its send in flight. The whole history."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=CLIENTS_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the clients ignored SIGTERM: {self.log()}") from None
        assert code == 0, f"the clients exited with {code}: {self.log()}"
        return self.poll()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Cluster:
    net: Network
    tmp: Path
    started: list[ServiceProcess] = field(default_factory=list)
    zk: ZooKeeperServer | None = None
    clients: list[Clients] = field(default_factory=list)

    def node(self, name: str) -> Node:
        return self.net.nodes.get(name) or self.net.add(name)

    def start_zookeeper(self) -> ZooKeeperServer:
        node = self.node("zk")
        self.zk = ZooKeeperServer(
            self.tmp / "zookeeper", ZOOKEEPER_PORT, host=node.ip, launcher=node.launcher
        )
        self.zk.start()
        return self.zk

    def start_nameserver(self, *flags: str) -> NameServerProcess:
        node = self.node("ns")
        address = f"{node.ip}:{NAMESERVER_PORT}"
        log_path = self.tmp / "nameserver.log"
        args = ["-m", "tidemq.cli", "nameserver", "--listen", address, *flags]
        ns = NameServerProcess(spawn_in(node, args, log_path), address, log_path)
        self.started.append(ns)
        ns.wait_serving()
        return ns

    def start_broker(
        self, *flags: str, store: str = "broker", port: int | None = None
    ) -> BrokerProcess:
        """In node ``store`` (created on first use), on ``port`` (default ``BROKER_PORT``)."""
        node = self.node(store)
        address = f"{node.ip}:{port or BROKER_PORT}"
        store_dir = self.tmp / store
        log_path = self.tmp / f"{store}.log"
        args = ["-m", "tidemq.cli", "broker", "--listen", address, "--store", str(store_dir)]
        proc = spawn_in(node, [*args, "--store-overrides", SMALL_STORE, *flags], log_path)
        b = BrokerProcess(proc, address, log_path, store_dir=store_dir)
        self.started.append(b)
        b.wait_serving()
        return b

    def start_clients(
        self, nameserver: NameServerProcess, topic: str, producers: int = 2
    ) -> Clients:
        node = self.node("clients")
        n = len(self.clients)
        out, log_path = self.tmp / f"answers-{n}.jsonl", self.tmp / f"clients-{n}.log"
        out.touch()
        args = ["-m", "tests.integration.partition_clients", "--nameserver", nameserver.address]
        args += ["--topic", topic, "--producers", str(producers), "--out", str(out)]
        c = Clients(spawn_in(node, args, log_path), out, log_path)
        self.clients.append(c)
        return c

    def stop(self, request: pytest.FixtureRequest) -> None:
        """Heal, stop the clients, the brokers and the nameserver (SIGTERM, each in time), then
        ZooKeeper."""
        try:
            self.net.heal()
        finally:
            try:
                for c in self.clients:
                    if c.proc.poll() is None:
                        c.proc.kill()
                        c.proc.wait()
                stop_all(self.started, request)
            finally:
                if self.zk is not None:
                    self.zk.stop()
