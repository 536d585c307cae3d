"""Real nameserver processes for integration tests.

``start_nameserver(*flags)`` runs ``python -m tidemq.cli nameserver`` on a free loopback port,
logging to a file under tmp_path, and returns once GetStatus answers (or fails with the log).
Every process still running at the end of a test is stopped by its PID with SIGTERM; the logs of
a failed test are printed so the report shows what the server saw.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from tests.integration.zookeeper import start_zookeeper, zk_root, zookeeper  # noqa: F401 - fixtures
from tidemq.protos import broker_pb2, broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings, sync_channel

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class ServiceProcess:
    """A tidemq process started by a test; subclasses say how to probe and talk to it."""

    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path
    _channel: grpc.Channel | None = field(default=None, repr=False)
    # How the test talks to it: over TLS with these settings, plaintext without.
    tls: TlsSettings | None = field(default=None, kw_only=True)
    credentials: Credentials | None = field(default=None, kw_only=True)

    kind = "service"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def channel(self) -> grpc.Channel:
        """This process's one channel (closed when the process is stopped)."""
        if self._channel is None:
            self._channel = sync_channel(self.address, self.tls, credentials=self.credentials)
        return self._channel

    def probe(self, channel: grpc.Channel, timeout_s: float) -> None:
        raise NotImplementedError

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the probe answers; fails at once if the process exits, or at the deadline."""
        deadline = time.monotonic() + timeout_s
        with sync_channel(self.address, self.tls, credentials=self.credentials) as channel:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"{self.kind} exited with {self.proc.returncode} while starting:\n"
                        + self.log()
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.kind} on {self.address} not serving after {timeout_s}s:\n"
                        + self.log()
                    )
                try:
                    # wait_for_ready: the call itself waits for the port, up to its deadline.
                    self.probe(channel, min(remaining, 1.0))
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                else:
                    return

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM by PID, then the exit code; raises if it does not exit within the deadline."""
        self._close_channel()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Its own session (start_new_session) holds only what we started.
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(
                f"{self.kind} ignored SIGTERM for {timeout_s}s:\n{self.log()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup runs."""
        self._close_channel()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@dataclass
class NameServerProcess(ServiceProcess):
    kind = "nameserver"

    def stub(self) -> nameserver_pb2_grpc.NameServerStub:
        return nameserver_pb2_grpc.NameServerStub(self.channel())

    def probe(self, channel: grpc.Channel, timeout_s: float) -> None:
        nameserver_pb2_grpc.NameServerStub(channel).GetStatus(
            nameserver_pb2.GetStatusRequest(), timeout=timeout_s, wait_for_ready=True
        )


@dataclass
class BrokerProcess(ServiceProcess):
    store_dir: Path = Path()
    # host:port of its RocketMQ 5 listener ("" when started without ``rocketmq=True``).
    rocketmq_address: str = ""
    kind = "broker"

    def stub(self) -> broker_pb2_grpc.BrokerStub:
        return broker_pb2_grpc.BrokerStub(self.channel())

    def probe(self, channel: grpc.Channel, timeout_s: float) -> None:
        broker_pb2_grpc.BrokerStub(channel).GetBrokerStatus(
            broker_pb2.GetBrokerStatusRequest(), timeout=timeout_s, wait_for_ready=True
        )


# Small store files: a test broker should not reserve gigabytes of disk.
SMALL_STORE = (
    '{"commitlog_file_size_bytes": 4194304, "consume_queue_entries_per_file": 10000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log_file:
        # The child keeps its own copy of the descriptor; ours can close at once.
        return subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


StartNameServer = Callable[..., NameServerProcess]


def stop_all(started: Sequence[ServiceProcess], request: pytest.FixtureRequest) -> None:
    """SIGTERM what is still running (each must exit in time), and print every process's log
    when the test failed."""
    problems = []
    for p in started:
        if p.proc.poll() is None:
            try:
                p.terminate()
            except AssertionError as e:
                problems.append(str(e))
    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        for p in started:
            print(f"----- {p.log_path.name} ({p.address}) -----\n{p.log()}")
    assert not problems, "\n".join(problems)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keep each phase's report on the test item, so fixtures can tell whether the test failed.
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture
def start_nameserver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartNameServer]:
    started: list[NameServerProcess] = []

    def start(
        *flags: str, tls: TlsSettings | None = None, credentials: Credentials | None = None
    ) -> NameServerProcess:
        address = f"127.0.0.1:{free_port()}"
        log_path = tmp_path / f"nameserver-{len(started)}.log"
        proc = spawn(["nameserver", "--listen", address, *flags], log_path)
        ns = NameServerProcess(proc, address, log_path, tls=tls, credentials=credentials)
        started.append(ns)
        ns.wait_serving()
        return ns

    yield start
    stop_all(started, request)


StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def start_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartBroker]:
    """Start brokers; the same ``store`` name restarts on the same store directory."""
    started: list[BrokerProcess] = []

    def start(
        *flags: str,
        store: str = "broker",
        port: int | None = None,
        rocketmq: bool = False,
        tls: TlsSettings | None = None,
        credentials: Credentials | None = None,
    ) -> BrokerProcess:
        address = f"127.0.0.1:{port or free_port()}"
        store_dir = tmp_path / store
        log_path = tmp_path / f"{store}.log"
        args = ["broker", "--listen", address, "--store", str(store_dir)]
        v2 = f"127.0.0.1:{free_port()}" if rocketmq else ""
        if v2:
            args += ["--rocketmq-listen", v2]
        proc = spawn([*args, "--store-overrides", SMALL_STORE, *flags], log_path)
        b = BrokerProcess(
            proc,
            address,
            log_path,
            store_dir=store_dir,
            rocketmq_address=v2,
            tls=tls,
            credentials=credentials,
        )
        started.append(b)
        b.wait_serving()
        return b

    yield start
    stop_all(started, request)


@pytest.fixture
def nameserver(start_nameserver: StartNameServer) -> NameServerProcess:
    """One nameserver with default settings."""
    return start_nameserver()
