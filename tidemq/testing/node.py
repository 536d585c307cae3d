"""One container of a ``TidemqCluster``: what it is, where it is reached, and the faults a test
can inflict on it.

The test process talks to every node at its IP address on the cluster's network, the address the
brokers advertise (a Linux host routes to its container bridges: Docker, or podman run as root).
"""

from __future__ import annotations

import enum
import socket
import time
from collections.abc import Callable
from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from tidemq import health


class Kind(enum.Enum):
    ZOOKEEPER = "zookeeper"
    NAMESERVER = "nameserver"
    BROKER = "broker"


PORTS = {Kind.ZOOKEEPER: 2181, Kind.NAMESERVER: 9876, Kind.BROKER: 10911}
# The image's default RocketMQ 5 listener (tidemq.entrypoint).
ROCKETMQ_PORT = 8081


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until true; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause_s = 0.02
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 0.5)


def zookeeper_mode(address: str, timeout_s: float = 1.0) -> str | None:
    """The ``Mode:`` a ZooKeeper server reports to ``srvr`` (standalone, leader, ...), or None."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
    except OSError:
        return None
    for line in reply.decode(errors="replace").splitlines():
        if line.startswith("Mode: "):
            return line.removeprefix("Mode: ").strip()
    return None


class Node:
    """A ZooKeeper, nameserver or broker container on the cluster's network.

    ``name`` is its host name and network alias, so other containers reach it by name; a broker
    pod's name ends in its broker id (``broker-a-1``), as in a StatefulSet.
    """

    def __init__(
        self,
        name: str,
        kind: Kind,
        container: DockerContainer,
        network: Network,
        rocketmq_port: int | None = None,
    ):
        self.name = name
        self.kind = kind
        self.container = container
        self.network = network
        self.rocketmq_port = rocketmq_port  # a broker's RocketMQ 5 listener; None: off
        self._ip: str | None = None  # the last known one, kept across disconnect()

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.kind.value})"

    @property
    def port(self) -> int:
        return PORTS[self.kind]

    def _docker(self) -> Any:  # docker.models.containers.Container (untyped library)
        return self.container.get_wrapped_container()

    def _attrs(self) -> dict[str, Any]:
        c = self._docker()
        c.reload()
        attrs: dict[str, Any] = c.attrs
        return attrs

    @property
    def status(self) -> str:
        """The engine's state: ``running``, ``paused``, ``exited``, ..."""
        return str(self._attrs()["State"]["Status"])

    @property
    def ip(self) -> str:
        """Its IP address on the cluster network (the last known one while disconnected)."""
        networks = self._attrs()["NetworkSettings"]["Networks"] or {}
        ip = (networks.get(self.network.name) or {}).get("IPAddress")
        if ip:
            self._ip = ip
        if self._ip is None:
            raise RuntimeError(f"{self.name} has no address on {self.network.name} yet")
        return self._ip

    @property
    def address(self) -> str:
        """``IP:PORT`` of its service (gRPC for tidemq nodes, the client port for ZooKeeper)."""
        return f"{self.ip}:{self.port}"

    @property
    def rocketmq_address(self) -> str:
        """``IP:PORT`` of a broker's RocketMQ 5 listener, what its routes name (the official
        RocketMQ clients' ``endpoints``)."""
        if self.rocketmq_port is None:
            raise RuntimeError(f"{self.name} serves no RocketMQ 5 protocol")
        return f"{self.ip}:{self.rocketmq_port}"

    def logs(self) -> str:
        out, err = self.container.get_logs()
        return (out + err).decode(errors="replace")

    def is_ready(self) -> bool:
        """ZooKeeper answers ``srvr`` with a mode; a nameserver or broker reports SERVING."""
        if self.status != "running":
            return False
        if self.kind is Kind.ZOOKEEPER:
            return zookeeper_mode(self.address) is not None
        return health.check(self.address, timeout_s=1.0) == "SERVING"

    def wait_ready(self, timeout_s: float) -> None:
        def ready() -> bool:
            if self.status in ("exited", "dead"):
                raise RuntimeError(f"{self.name} exited while starting:\n{self.logs()}")
            return self.is_ready()

        wait_for(ready, timeout_s, f"{self.name} to serve")

    # ------------------------------------------------------------------ faults
    def kill(self) -> None:
        """SIGKILL: the process dies at once, nothing is flushed or unregistered."""
        self._docker().kill(signal="SIGKILL")
        wait_for(lambda: self.status == "exited", 30, f"{self.name} to die")

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (0 for a clean stop)."""
        self._docker().stop(timeout=timeout_s)
        code: int = self._attrs()["State"]["ExitCode"]
        return code

    def start(self, timeout_s: float = 60) -> None:
        """Start a killed or stopped node again, same store; returns once it serves."""
        self._docker().start()
        self.wait_ready(timeout_s)

    def replace(self, timeout_s: float = 60) -> None:
        """Remove the container, store and all, and start a new one in its place (same name,
        settings and network): a node whose disk was lost."""
        self.container.stop(force=True, delete_volume=True)
        self._ip = None
        self.container.start()
        self.wait_ready(timeout_s)

    def pause(self) -> None:
        """Freeze every process (cgroup freezer): TCP still connects, nothing answers."""
        self._docker().pause()

    def unpause(self) -> None:
        self._docker().unpause()

    def disconnect(self) -> None:
        """Cut it off the cluster network: nobody reaches it and it reaches nobody."""
        self.ip  # noqa: B018 - remembered for reconnect()
        self.network._unwrap_network.disconnect(self.container.get_container_id())

    @property
    def holds_link_faults(self) -> bool:
        """Whether per-link faults can be set in its namespace: tidemq's image has iptables and
        runs with NET_ADMIN in a cluster; ZooKeeper's image has neither."""
        return self.kind is not Kind.ZOOKEEPER

    def run_as_root(self, script: str) -> str:
        """Run a shell script in the container as root; its output, or RuntimeError."""
        code, out = self._docker().exec_run(["sh", "-c", script], user="root")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        if code != 0:
            raise RuntimeError(f"{self.name}: script failed ({code}):\n{text}")
        return text

    def reconnect(self) -> None:
        """Back on the network under its name and with its old address, which it advertised."""
        self.network._unwrap_network.connect(
            self.container.get_container_id(), aliases=[self.name], ipv4_address=self._ip
        )
