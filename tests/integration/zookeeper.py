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
import ssl
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.tls_certs import Issued
from tests.waiting import wait_until

JAVA_DIR = Path("/usr/share/java")
JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
# TLS needs ZooKeeper's Netty connection factory; Debian's zookeeper package depends on
# libnetty-java, which brings these.
NETTY_JARS = (
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-handler.jar",
    "netty-resolver.jar",
    "netty-transport.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
)
TICK_MS = 500
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

# Every server's settings; the client port comes after (ZOO_PLAIN_PORT or ZOO_TLS_PORT).
ZOO_CFG = """\
tickTime={tick_ms}
initLimit=10
syncLimit=5
dataDir={data_dir}
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr,stat
forceSync=no
"""

ZOO_PLAIN_PORT = """\
clientPort={port}
clientPortAddress={host}
"""

# The secure client port instead of the plain one: a client speaks TLS and presents a certificate
# the CA signed, or is not served. PEM files, as an operator's cert-manager leaves them.
ZOO_TLS_PORT = """\
secureClientPort={port}
secureClientPortAddress={host}
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location={keystore}
ssl.keyStore.type=PEM
ssl.trustStore.location={ca_file}
ssl.trustStore.type=PEM
ssl.clientAuth=need
"""

LOG4J = """\
log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_path}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
"""


def java_command(config_dir: Path, tls: bool = False) -> list[str]:
    """The server's command line; fails the test when java or a jar is missing."""
    java = shutil.which("java")
    jars = JARS + NETTY_JARS if tls else JARS
    missing = [str(JAVA_DIR / jar) for jar in jars if not (JAVA_DIR / jar).exists()]
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
        ":".join(str(JAVA_DIR / jar) for jar in jars),
        f"-Dlog4j.configuration=file:{config_dir / 'log4j.properties'}",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        str(config_dir / "zoo.cfg"),
    ]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def srvr(
    port: int,
    timeout_s: float = 1.0,
    host: str = "127.0.0.1",
    tls: ssl.SSLContext | None = None,
) -> str:
    """The answer to the ``srvr`` four-letter command, or "" when nothing answers."""
    try:
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
            if tls is not None:
                # Handshake after the socket is in the stack: one that fails (the server still
                # starting) closes it too.
                s = stack.enter_context(
                    tls.wrap_socket(s, server_hostname=host, do_handshake_on_connect=False)
                )
                s.do_handshake()
            s.sendall(b"srvr")
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


@dataclass(frozen=True)
class ZooKeeperTls:
    """A server's TLS files: the CA its clients' certificates must chain to, its own
    certificate, and a client certificate the harness probes it with."""

    ca_file: str
    server: Issued
    client: Issued

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        context.load_cert_chain(self.client.cert_file, self.client.key_file)
        return context


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
    tls: ZooKeeperTls | None = None

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
        settings = {
            "tick_ms": TICK_MS,
            "data_dir": self.directory / "data",
            "port": self.port,
            "host": self.host,
        }
        probe = None
        if self.tls is None:
            (self.directory / "zoo.cfg").write_text((ZOO_CFG + ZOO_PLAIN_PORT).format(**settings))
        else:
            # The key (in PKCS#8, the only form ZooKeeper's PEM reader takes) and the
            # certificate, in one file.
            pkcs8 = subprocess.run(
                ["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", self.tls.server.key_file],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            keystore = self.directory / "server-keystore.pem"
            keystore.write_text(pkcs8 + Path(self.tls.server.cert_file).read_text())
            (self.directory / "zoo.cfg").write_text(
                (ZOO_CFG + ZOO_TLS_PORT).format(
                    **settings, keystore=keystore, ca_file=self.tls.ca_file
                )
            )
            probe = self.tls.client_context()
        (self.directory / "log4j.properties").write_text(LOG4J.format(log_path=self.log_path))
        command = [*self.launcher, *java_command(self.directory, tls=self.tls is not None)]
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
            return "Mode: standalone" in srvr(self.port, host=self.host, tls=probe)

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
        """A connected kazoo client of the test's own (its session ends with the block); over
        TLS with the harness's client certificate when the server speaks TLS."""
        tls: dict[str, object] = {}
        if self.tls is not None:
            tls = {
                "use_ssl": True,
                "ca": self.tls.ca_file,
                "certfile": self.tls.client.cert_file,
                "keyfile": self.tls.client.key_file,
                "check_hostname": True,
            }
        zk = KazooClient(hosts=self.hosts, timeout=5, **tls)
        zk.start(timeout=15)
        try:
            yield zk
        finally:
            zk.stop()
            zk.close()


def new_server(directory: Path, tls: ZooKeeperTls | None = None) -> ZooKeeperServer:
    return ZooKeeperServer(directory, _free_port(), tls=tls)


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

    def start(*, run: bool = True, tls: ZooKeeperTls | None = None) -> ZooKeeperServer:
        server = new_server(tmp_path / f"zookeeper-{len(servers)}", tls)
        servers.append(server)
        if run:
            server.start()
        return server

    yield start
    for server in servers:
        server.stop()
