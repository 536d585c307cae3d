"""A network of Linux network namespaces for partition tests: each process (ZooKeeper, the
nameserver, every broker, the clients) gets a namespace of its own with one address, and a cut
between two of them is a firewall rule in one namespace.

Layout: a hub namespace holds a bridge; every node namespace is joined to it by a veth pair
(``eth0`` inside, ``v<n>`` on the bridge), all on one /24 of 10.218.0.0/16. The test process
itself stays in the root namespace and joins the bridge too (``observer``), so it can probe any
node whatever is cut between the nodes: partitions are rules inside node namespaces, never on
the observer's path.

``cut(a, b)`` drops what ``a`` sends to ``b`` (an iptables OUTPUT rule in ``a``'s namespace), so
a one-way partition is one call and a full one two; ``heal()`` removes every rule.

Names carry the test process's pid (``tq<pid>x<n>-<node>``): ``close`` deletes the namespaces
(the veths go with them) even when the test failed, and a new network first deletes those left
by a process that no longer runs (one killed before its teardown).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

SUPERNET = ipaddress.IPv4Network("10.218.0.0/16")
OBSERVER_HOST = 254
_NAME = re.compile(r"^tq(\d+)x\d+-")
_counter = itertools.count()


class NetnsUnavailableError(RuntimeError):
    """This machine cannot build the network (not root, or ``ip netns`` fails)."""


def run(*args: str) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise NetnsUnavailableError(f"{' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


@dataclass(frozen=True)
class Node:
    name: str
    netns: str
    ip: str

    @property
    def launcher(self) -> tuple[str, ...]:
        """The command-line prefix that runs a program in this node's namespace."""
        return ("ip", "netns", "exec", self.netns)


@dataclass
class Network:
    prefix: str
    subnet: ipaddress.IPv4Network
    nodes: dict[str, Node] = field(default_factory=dict)
    cuts: set[tuple[str, str]] = field(default_factory=set)

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    @property
    def observer_link(self) -> str:
        return f"{self.prefix}o"  # in the root namespace: at most 15 characters

    @property
    def observer_ip(self) -> str:
        """The test process's address on the bridge."""
        return self._address(OBSERVER_HOST)

    def _address(self, host: int) -> str:
        return str(self.subnet.network_address + host)

    def build(self) -> None:
        """The hub and its bridge, and the observer's link from the root namespace (the hub
        namespace exists already)."""
        run("ip", "-n", self.hub, "link", "set", "lo", "up")
        run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.hub, "link", "set", "br0", "up")
        link = self.observer_link
        run("ip", "link", "add", link, "type", "veth", "peer", "name", "obs", "netns", self.hub)
        run("ip", "-n", self.hub, "link", "set", "obs", "master", "br0", "up")
        plen = self.subnet.prefixlen
        run("ip", "addr", "add", f"{self.observer_ip}/{plen}", "dev", link)
        run("ip", "link", "set", link, "up")

    def add(self, name: str) -> Node:
        """A node: a namespace joined to the bridge, with the next address of the subnet."""
        n = len(self.nodes) + 1
        node = Node(name, f"{self.prefix}-{name}", self._address(n))
        run("ip", "netns", "add", node.netns)
        self.nodes[name] = node
        run("ip", "-n", node.netns, "link", "set", "lo", "up")
        peer = f"v{n}"
        run(
            *("ip", "-n", node.netns, "link", "add", "eth0", "type", "veth"),
            *("peer", "name", peer, "netns", self.hub),
        )
        run("ip", "-n", self.hub, "link", "set", peer, "master", "br0", "up")
        run(
            "ip",
            "-n",
            node.netns,
            "addr",
            "add",
            f"{node.ip}/{self.subnet.prefixlen}",
            "dev",
            "eth0",
        )
        run("ip", "-n", node.netns, "link", "set", "eth0", "up")
        return node

    def _iptables(self, node: Node, *args: str) -> None:
        run(*node.launcher, "iptables", "-w", *args)

    def cut(self, src: str, dst: str) -> None:
        """Drop every packet ``src`` sends to ``dst``. What ``dst`` sends still arrives: TCP
        needs both ways, so new connections fail either way round, but on a connection already
        open ``dst``'s segments are still delivered (unacknowledged)."""
        if (src, dst) in self.cuts:
            return
        self._iptables(self.nodes[src], "-A", "OUTPUT", "-d", self.nodes[dst].ip, "-j", "DROP")
        self.cuts.add((src, dst))

    def cut_both(self, a: str, b: str) -> None:
        self.cut(a, b)
        self.cut(b, a)

    def heal(self) -> None:
        for src in sorted({s for s, _ in self.cuts}):
            self._iptables(self.nodes[src], "-F", "OUTPUT")
        self.cuts.clear()

    def close(self) -> None:
        """Delete every namespace; the veth pairs, the bridge and the observer's link go with
        them. Processes still running in a namespace keep it alive only until they exit."""
        for node in self.nodes.values():
            delete_namespace(node.netns)
        delete_namespace(self.hub)
        with contextlib.suppress(NetnsUnavailableError):
            run("ip", "link", "del", self.observer_link)  # gone with its peer, normally


def delete_namespace(name: str) -> None:
    with contextlib.suppress(NetnsUnavailableError):
        run("ip", "netns", "del", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> None:
    """Delete the namespaces of test processes that died before their teardown."""
    for line in run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NAME.match(name)
        if m is not None and not _alive(int(m.group(1))):
            delete_namespace(name)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of the supernet that no network of the root namespace overlaps."""
    used = run("ip", "-4", "-o", "addr", "show")
    taken = [ipaddress.IPv4Interface(m).network for m in re.findall(r"inet (\S+)", used)]
    subnets = list(SUPERNET.subnets(new_prefix=24))[1:-1]
    random.shuffle(subnets)
    for s in subnets:
        if not any(s.overlaps(t) for t in taken):
            return s
    raise NetnsUnavailableError(f"no free /24 left in {SUPERNET}")


def unavailable_reason() -> str | None:
    """Why this machine cannot run partition tests, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the tests as root)"
    try:
        run("ip", "netns", "list")
    except (NetnsUnavailableError, FileNotFoundError) as e:
        return f"ip netns does not work here: {e}"
    return None


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A network of this test's own, built (or the test skipped, with the reason) and deleted
    at the end whatever happens."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_leftovers()
    net = Network(f"tq{os.getpid()}x{next(_counter)}", _free_subnet())
    try:
        run("ip", "netns", "add", net.hub)
    except NetnsUnavailableError as e:
        pytest.skip(f"ip netns does not work here: {e}")
    try:
        net.build()
        yield net
    finally:
        net.close()
