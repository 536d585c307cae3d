"""``TidemqCluster``: ZooKeeper, nameservers and broker groups in containers, for failover tests."""

from __future__ import annotations

import os
import string
import sys
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import docker.errors
import grpc
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from tidemq.admin import Admin
from tidemq.consumer import Consumer
from tidemq.producer import Producer
from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.testing.config import (
    DEFAULT_BROKER_CONFIG,
    DEFAULT_IMAGE,
    DEFAULT_ZOOKEEPER_IMAGE,
    IMAGE_ENV,
    LABEL,
    RUN_LABEL_ENV,
    ZOOKEEPER_IMAGE_ENV,
    ZOOKEEPER_TICK_MS,
    broker_toml,
)
from tidemq.testing.links import LinkFaults, enforcer, script
from tidemq.testing.node import ROCKETMQ_PORT, Kind, Node, wait_for

Nodes = str | Node | Iterable[str | Node]


def _start(container: DockerContainer, attempts: int = 3) -> None:
    """Create and start ``container``, again if the engine fails a call on the way: podman 4.3's
    API now and then breaks a copy into a new container ("write |1: broken pipe")."""
    for attempt in range(1, attempts + 1):
        try:
            container.start()
        except docker.errors.APIError:
            container.stop(force=True, delete_volume=True)
            if attempt == attempts:
                raise
        else:
            return


def group_names(count: int) -> list[str]:
    """``broker-a``, ``broker-b``, ... as RocketMQ names its groups."""
    if not 0 < count <= len(string.ascii_lowercase):
        raise ValueError(f"broker_groups must be 1 to 26, got {count}")
    return [f"broker-{letter}" for letter in string.ascii_lowercase[:count]]


class TidemqCluster:
    """A real tidemq cluster in containers on a network of its own.

    ZooKeeper (``zookeeper``), ``nameservers`` nameservers on the ZooKeeper registry
    (``nameserver-0``, ...), and ``broker_groups`` groups of a master and ``slaves`` slaves
    (``broker-a-0`` is broker-a's master, ``broker-a-1`` its first slave). Brokers read
    ``broker_config`` (BrokerConfig keys, over small test defaults) from a mounted
    ``/etc/tidemq/broker.toml``, as the Helm chart runs them. Every broker also serves RocketMQ
    5's protocol on port 8081 (the image's default; ``rocketmq_listen`` in ``broker_config``
    moves it, ``""`` turns it off) for the official RocketMQ clients: ``rocketmq_endpoints``.

    Use it as a context manager: on the way out every container and the network are removed, and
    when the block raised, every node's log is written to ``logs_dir`` (a temporary directory by
    default) and its path printed.
    """

    def __init__(
        self,
        *,
        broker_groups: int = 1,
        slaves: int = 1,
        nameservers: int = 2,
        master_role: str = "ASYNC_MASTER",
        failover: str = "classic",
        broker_config: Mapping[str, Any] | None = None,
        image: str | None = None,
        zookeeper_image: str | None = None,
        cluster_name: str = "DefaultCluster",
        start_timeout_s: float = 90,
        logs_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if master_role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            raise ValueError(f"master_role must be ASYNC_MASTER or SYNC_MASTER, not {master_role}")
        if failover not in ("classic", "auto"):
            raise ValueError(f"failover must be classic or auto, not {failover}")
        if slaves < 0 or nameservers < 1:
            raise ValueError("slaves must be >= 0 and nameservers >= 1")
        self.groups = group_names(broker_groups)
        self.slaves_per_group = slaves
        self.nameserver_count = nameservers
        self.master_role = master_role
        self.failover = failover
        self.broker_config = {**DEFAULT_BROKER_CONFIG, "cluster": cluster_name}
        self.broker_config.update(broker_config or {})
        self.image = image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE
        self.zookeeper_image = (
            zookeeper_image or os.environ.get(ZOOKEEPER_IMAGE_ENV) or DEFAULT_ZOOKEEPER_IMAGE
        )
        self.start_timeout_s = start_timeout_s
        self.logs_dir = Path(logs_dir) if logs_dir is not None else None
        self.id = uuid.uuid4().hex[:8]
        self.labels = {LABEL: self.id, f"{LABEL}.run": os.environ.get(RUN_LABEL_ENV, "")}
        self.network = Network(docker_network_kw={"labels": self.labels})
        self.nodes: dict[str, Node] = {}
        self.links = LinkFaults()
        self._faulted: set[str] = set()  # nodes whose namespace holds (or held) link rules
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> TidemqCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                self.report_logs()
        finally:
            self.close()

    def start(self) -> TidemqCluster:
        """Create everything and return once every node serves and every broker is routed."""
        self.network.create()
        self._started = True
        try:
            zk = self._add("zookeeper", Kind.ZOOKEEPER, self.zookeeper_image, [], {})
            zk.wait_ready(self.start_timeout_s)
            zk_connect = {"TIDEMQ_ZK": "zookeeper:2181"}
            for i in range(self.nameserver_count):
                self._add(
                    f"nameserver-{i}", Kind.NAMESERVER, self.image, ["nameserver"], zk_connect
                )
            toml = broker_toml(self.broker_config).encode()
            for group in self.groups:
                for ordinal in range(self.slaves_per_group + 1):
                    env = {**zk_connect, "TIDEMQ_BROKER_NAME": group}
                    # The same command for every broker of a group, as in the Helm chart's
                    # StatefulSets: classic, the ordinal in the host name makes pod 0 the
                    # master; automatic failover, the brokers (ids from 1) elect one.
                    if self.automatic:
                        command = ["broker", "--failover", "auto", "--broker-id", "ordinal+1"]
                        command += ["--role", self.master_role]
                    else:
                        command = ["broker", "--broker-id", "ordinal"]
                        command += ["--role", f"ordinal:{self.master_role}"]
                    self._add(f"{group}-{ordinal}", Kind.BROKER, self.image, command, env, toml)
            for node in self.nodes.values():
                node.wait_ready(self.start_timeout_s)
            self.wait_routed(self.start_timeout_s)
        except BaseException:
            self.report_logs()
            self.close()
            raise
        return self

    @property
    def rocketmq_port(self) -> int | None:
        """The brokers' RocketMQ 5 port: the image's default unless ``broker_config`` sets
        ``rocketmq_listen`` (``""``: off, None here)."""
        listen = self.broker_config.get("rocketmq_listen")
        if listen is None:
            return ROCKETMQ_PORT
        return int(str(listen).rpartition(":")[2]) if listen else None

    def _add(
        self,
        name: str,
        kind: Kind,
        image: str,
        command: list[str],
        env: Mapping[str, str],
        broker_toml: bytes | None = None,
    ) -> Node:
        kwargs: dict[str, Any] = {"hostname": name, "labels": self.labels}
        if kind is not Kind.ZOOKEEPER:
            # Per-link faults set iptables rules in the node's namespace (as root, by exec).
            kwargs["cap_add"] = ["NET_ADMIN"]
        container = (
            DockerContainer(image)
            .with_network(self.network)
            .with_network_aliases(name)
            .with_kwargs(**kwargs)
            .with_envs(**env)
        )
        if kind is Kind.ZOOKEEPER:
            container.with_env("ZOO_TICK_TIME", str(ZOOKEEPER_TICK_MS))
            container.with_env("ZOO_4LW_COMMANDS_WHITELIST", "srvr,ruok,mntr")
        if command:
            container.with_command(command)
        if broker_toml is not None:
            container.with_copy_into_container(broker_toml, "/etc/tidemq/broker.toml")
        v2_port = self.rocketmq_port if kind is Kind.BROKER else None
        node = Node(name, kind, container, self.network, rocketmq_port=v2_port)
        self.nodes[name] = node
        _start(container)
        return node

    def close(self) -> None:
        """Remove every container (and its volumes) and the network."""
        nodes, self.nodes = list(self.nodes.values()), {}
        for node in nodes:
            node.container.stop(force=True, delete_volume=True)
        if self._started:
            self._started = False
            self.network.remove()

    # ------------------------------------------------------------------ nodes
    def node(self, node: str | Node) -> Node:
        return node if isinstance(node, Node) else self.nodes[node]

    @property
    def zookeeper(self) -> Node:
        return self.nodes["zookeeper"]

    @property
    def nameservers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind is Kind.NAMESERVER]

    def brokers(self, group: str | None = None) -> list[Node]:
        return [
            n
            for n in self.nodes.values()
            if n.kind is Kind.BROKER and (group is None or n.name.rpartition("-")[0] == group)
        ]

    @property
    def automatic(self) -> bool:
        return self.failover == "auto"

    def master(self, group: str = "broker-a") -> Node:
        """The group's master: pod 0 (classic), or the broker the routes name (automatic
        failover; raises while the group has none)."""
        if not self.automatic:
            return self.nodes[f"{group}-0"]
        with self.admin() as admin:
            address = admin.masters().get(group)
        for node in self.brokers(group):
            if address is not None and node.address == address:
                return node
        raise RuntimeError(f"broker group {group} has no master in the routes now")

    def slaves(self, group: str = "broker-a") -> list[Node]:
        master = self.master(group)
        return [n for n in self.brokers(group) if n is not master]

    @property
    def nameserver_address(self) -> str:
        """``IP:9876,IP:9876``: what the SDK and the CLI take as ``nameserver``."""
        return ",".join(n.address for n in self.nameservers)

    # ------------------------------------------------------------------ faults
    def kill(self, node: str | Node) -> None:
        self.node(node).kill()

    def stop(self, node: str | Node, timeout_s: float = 30) -> int:
        return self.node(node).stop(timeout_s)

    def start_node(self, node: str | Node, timeout_s: float | None = None) -> None:
        self.node(node).start(timeout_s or self.start_timeout_s)
        self._apply_links()  # a started container has a new namespace, without the rules

    def restart(self, node: str | Node, timeout_s: float | None = None) -> None:
        self.stop(node)
        self.start_node(node, timeout_s)

    def replace(self, node: str | Node, timeout_s: float | None = None) -> None:
        self.node(node).replace(timeout_s or self.start_timeout_s)
        self._apply_links()  # its namespace is new, and its address may be

    def pause(self, node: str | Node) -> None:
        self.node(node).pause()

    def unpause(self, node: str | Node) -> None:
        self.node(node).unpause()

    def disconnect(self, node: str | Node) -> None:
        self.node(node).disconnect()

    def reconnect(self, node: str | Node) -> None:
        self.node(node).reconnect()

    # Per-link faults: between two nodes only, each still reaching every other node.
    def _names(self, nodes: Nodes) -> list[str]:
        if isinstance(nodes, str | Node):
            nodes = [nodes]
        return [self.node(n).name for n in nodes]

    def _links_between(self, side: Nodes, other: Nodes) -> list[tuple[str, str]]:
        pairs = [(a, b) for a in self._names(side) for b in self._names(other)]
        able = {n.name: n.holds_link_faults for n in self.nodes.values()}
        for a, b in pairs:
            enforcer(frozenset((a, b)), able)  # ValueError before anything changes
        return pairs

    def delay(self, side: Nodes, other: Nodes, delay_ms: float) -> None:
        """Every packet between a node of ``side`` and one of ``other`` arrives ``delay_ms``
        later, each way (a round trip takes ``2 * delay_ms`` more), established connections
        included; 0 ends the delay."""
        for a, b in self._links_between(side, other):
            self.links.delay(a, b, delay_ms)
        self._apply_links()

    def partition(self, side: Nodes, other: Nodes) -> None:
        """Cut every link between a node of ``side`` and one of ``other``, both directions,
        established connections included (packets vanish: peers see timeouts, not resets).
        Each node still reaches every node not on the other side."""
        for a, b in self._links_between(side, other):
            self.links.cut(a, b)
        self._apply_links()

    def heal(self, side: Nodes | None = None, other: Nodes | None = None) -> None:
        """End the delays and cuts between ``side`` and ``other``; without them, all."""
        if side is None or other is None:
            self.links.heal_all()
        else:
            for a, b in self._links_between(side, other):
                self.links.heal(a, b)
        self._apply_links()

    def _apply_links(self) -> None:
        self._faulted |= self.links.nodes_touched()
        if not self._faulted:
            return
        ips = {n.name: n.ip for n in self.nodes.values()}
        able = {n.name: n.holds_link_faults for n in self.nodes.values()}
        for name in sorted(self._faulted):
            node = self.nodes[name]
            if node.holds_link_faults and node.status == "running":
                node.run_as_root(script(self.links.plan(name, ips, able)))

    # ------------------------------------------------------------------ clients
    def producer(self, **settings: Any) -> Producer:
        return Producer(self.nameserver_address, **settings)

    def consumer(self, group: str, topic: str, **settings: Any) -> Consumer:
        return Consumer(self.nameserver_address, group=group, topic=topic, **settings)

    def admin(self) -> Admin:
        return Admin(self.nameserver_address)

    @property
    def rocketmq_endpoints(self) -> str:
        """``IP:8081;IP:8081``: every broker's RocketMQ 5 address, what an official RocketMQ 5
        client takes as ``endpoints`` (any one broker would do: it answers the routes of all)."""
        if self.rocketmq_port is None:
            raise RuntimeError("the brokers serve no RocketMQ 5 protocol (rocketmq_listen is off)")
        return ";".join(n.rocketmq_address for n in self.brokers())

    def routed_brokers(self, nameserver: str | Node | None = None) -> set[str]:
        """``broker-a/0``, ... as a nameserver (default: the first) routes them right now."""
        address = self.node(nameserver or self.nameservers[0]).address
        with grpc.insecure_channel(address) as channel:
            info = nameserver_pb2_grpc.NameServerStub(channel).GetClusterInfo(
                nameserver_pb2.GetClusterInfoRequest(), timeout=5
            )
        return {
            f"{b.broker.identity.broker_name}/{b.broker.identity.broker_id}"
            for c in info.clusters
            for b in c.brokers
        }

    def wait_routed(
        self, timeout_s: float = 60, brokers: Iterable[str | Node] | None = None
    ) -> None:
        """Until every nameserver routes ``brokers`` (default: every broker node)."""
        nodes = [self.node(b) for b in (brokers if brokers is not None else self.brokers())]
        wanted = {f"{n.name.rpartition('-')[0]}/{n.name.rpartition('-')[2]}" for n in nodes}

        def all_there(routed: set[str]) -> bool:
            if not self.automatic:
                return wanted <= routed
            # Elected ids: each group has a master (id 0) and every one of its brokers.
            for group in {n.name.rpartition("-")[0] for n in nodes}:
                members = {r for r in routed if r.rpartition("/")[0] == group}
                want = sum(n.name.rpartition("-")[0] == group for n in nodes)
                if f"{group}/0" not in members or len(members) < want:
                    return False
            return True

        def routed() -> bool:
            try:
                return all(all_there(self.routed_brokers(ns)) for ns in self.nameservers)
            except grpc.RpcError:  # not serving yet is what we wait out
                return False

        wait_for(routed, timeout_s, f"the nameservers to route {sorted(wanted)}")

    def wait_synced(self, timeout_s: float = 60) -> None:
        """Until every slave holds its master's whole CommitLog and its topics (config sync runs
        every few seconds): a fault injected before that tests a slave that was still behind."""

        def synced() -> bool:
            with self.admin() as admin:
                status = admin.cluster_status()
            members = {
                (b["broker_name"], b["broker_id"]): b
                for c in status["clusters"]
                for b in c["brokers"]
                if b["reachable"]
            }
            for group in self.groups:
                master = members.get((group, 0))
                if master is None:
                    return False
                slave_ids = [i for (g, i) in members if g == group and i != 0]
                if len(slave_ids) < self.slaves_per_group:
                    return False
                for broker_id in slave_ids:
                    slave = members.get((group, broker_id))
                    if (
                        slave is None
                        or slave["topics"] < master["topics"]
                        or slave["store"]["commitlog_max_offset"]
                        != master["store"]["commitlog_max_offset"]
                    ):
                        return False
            return True

        wait_for(synced, timeout_s, "every slave to hold its master's log and topics")

    # ------------------------------------------------------------------ logs
    def dump_logs(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Every node's log as ``<node>.log`` in ``directory``; the files written."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for node in self.nodes.values():
            path = out / f"{node.name}.log"
            try:
                path.write_text(node.logs())
            except Exception as e:  # noqa: BLE001 - one lost log must not hide the others
                path.write_text(f"(log unavailable: {e})\n")
            written.append(path)
        return written

    def report_logs(self) -> Path:
        """Dump the logs (to ``logs_dir`` or a new temporary directory) and say where."""
        directory = self.logs_dir or Path(tempfile.mkdtemp(prefix=f"tidemq-cluster-{self.id}-"))
        self.dump_logs(directory)
        print(f"tidemq cluster {self.id}: container logs in {directory}", file=sys.stderr)
        return directory
