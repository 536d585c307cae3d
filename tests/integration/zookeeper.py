"""A real ZooKeeper for integration tests: Debian's ``zookeeper`` package, standalone, loopback.

- ``zookeeper`` (session scope): one server for the whole run. Tests share it and stay apart by
  each using its own registry root (``zk_root``).
- ``start_zookeeper`` (per test): servers of the test's own, for tests that stop or restart
  ZooKeeper; each is stopped by its PID at the end of the test.

Settings as measured in the shared ZooKeeper guide: tickTime 500 ms, so the server grants session
timeouts of 1-10 s (2-20 ticks) and a test's brokers can expire within seconds. The server logs
to ``zookeeper.log`` in its directory, beside its data.

Missing java or the jars fail the tests that need ZooKeeper, with a message saying what to
install: ``.ci/run`` installs the package, so their absence is a broken machine, never a reason to
skip silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.waiting import wait_until

JAVA_DIR = Path("/usr/share/java")
JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
TICK_MS = 500
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

ZOO_CFG = """\
tickTime={tick_ms}
initLimit=10
syncLimit=5
dataDir={data_dir}
clientPort={port}
clientPortAddress={host}
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr,stat
forceSync=no
"""

LOG4J = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_path}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
"""


def java_command(config_dir: Path) -> list[str]:
    """The server's command line; fails the test when java or a jar is missing."""
    java = shutil.which("java")
    missing = [str(JAVA_DIR / jar) for jar in JARS if not (JAVA_DIR / jar).exists()]
    if java is None or missing:
        pytest.fail(
            "ZooKeeper tests need Debian's zookeeper package (it brings a JRE): "
            "apt-get install --no-install-recommends zookeeper, as .ci/run does. Missing: "
            + ", ".join((["java on PATH"] if java is None else []) + missing),
            pytrace=False,
        )
    return [
        java,
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-cp",
        ":".join(str(JAVA_DIR / jar) for jar in JARS),
        f"-Dlog4j.configuration=file:{config_dir / 'log4j.properties'}",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        str(config_dir / "zoo.cfg"),
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def srvr(port: int, timeout_s: float = 1.0, host: str = "127.0.0.1") -> str:
    """The answer to the ``srvr`` four-letter command, or "" when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"srvr")
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


@dataclass
class ZooKeeperServer:
    """One standalone server; ``stop`` and ``start`` again keep its data and port.

    ``host`` is the address it listens on; ``launcher`` prefixes its command line (``ip netns
    exec NS`` runs it in a network namespace, as the partition tests do)."""

    directory: Path
    port: int
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    host: str = "127.0.0.1"
    launcher: tuple[str, ...] = ()

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    def log(self) -> str:
        parts = []
        for path in (self.directory / "stdout.log", self.log_path):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Spawn the server and return once it serves; fails with its log if it does not."""
        assert self.proc is None, "already running"
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        (self.directory / "zoo.cfg").write_text(
            ZOO_CFG.format(
                tick_ms=TICK_MS, data_dir=self.directory / "data", port=self.port, host=self.host
            )
        )
        (self.directory / "log4j.properties").write_text(LOG4J.format(log_path=self.log_path))
        command = [*self.launcher, *java_command(self.directory)]
        with (self.directory / "stdout.log").open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = self.proc

        def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"ZooKeeper exited with {proc.returncode} while starting")
            return "Mode: standalone" in srvr(self.port, host=self.host)

        try:
            wait_until(serving, timeout_s, "ZooKeeper to serve")
        except AssertionError as e:
            self.stop()
            raise AssertionError(f"{e}:\n{self.log()}") from None

    def stop(self) -> None:
        """SIGTERM by PID and wait (SIGKILL after ``STOP_TIMEOUT_S``)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @contextlib.contextmanager
    def client(self) -> Iterator[KazooClient]:
        """A connected kazoo client of the test's own (its session ends with the block)."""
        zk = KazooClient(hosts=self.hosts, timeout=5)
        zk.start(timeout=15)
        try:
            yield zk
        finally:
            zk.stop()
            zk.close()


def new_server(directory: Path) -> ZooKeeperServer:
    return ZooKeeperServer(directory, _free_port())


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = new_server(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_root() -> str:
    """A registry root of this test's own on the shared server."""
    return f"/test-{uuid.uuid4().hex[:12]}"


StartZooKeeper = Callable[..., ZooKeeperServer]


@pytest.fixture
def start_zookeeper(tmp_path: Path) -> Iterator[StartZooKeeper]:
    """``start_zookeeper(run=True)``: a server of the test's own; ``run=False`` only picks its
    port and directory, for a test that starts it later."""
    servers: list[ZooKeeperServer] = []

    def start(*, run: bool = True) -> ZooKeeperServer:
        server = new_server(tmp_path / f"zookeeper-{len(servers)}")
        servers.append(server)
        if run:
            server.start()
        return server

    yield start
    for server in servers:
        server.stop()
