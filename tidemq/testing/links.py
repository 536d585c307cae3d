"""Per-link faults of a ``TidemqCluster``: which links are slow or cut, and, for each node, the
iptables rules and ``link_delay`` queues that make it so. Pure state: the cluster applies the
plans inside the containers (``Node.apply_link_plan``).

A link's fault is enforced in one network namespace, on the tidemq side of the link (ZooKeeper's
image has no iptables): packets to the peer leave through the fault, packets from it arrive
through it, so a delay of ``d`` ms is ``d`` each way (``2d`` more per round trip) and a cut drops
both directions, established connections included, while both nodes still reach everyone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CHAIN = "TIDEMQ-FAULTS"


@dataclass(frozen=True)
class LinkFault:
    delay_ms: float = 0.0  # each way
    cut: bool = False


@dataclass(frozen=True)
class NodePlan:
    """What one node's namespace must hold: rules for CHAIN, and queue -> delay in ms."""

    rules: tuple[tuple[str, ...], ...]
    delays: Mapping[int, float]


class LinkFaults:
    def __init__(self) -> None:
        self._links: dict[frozenset[str], LinkFault] = {}

    def _key(self, a: str, b: str) -> frozenset[str]:
        if a == b:
            raise ValueError(f"a link joins two nodes, not {a} to itself")
        return frozenset((a, b))

    def delay(self, a: str, b: str, delay_ms: float) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        key = self._key(a, b)
        fault = LinkFault(delay_ms, self._links.get(key, LinkFault()).cut)
        self._set(key, fault)

    def cut(self, a: str, b: str) -> None:
        key = self._key(a, b)
        self._set(key, LinkFault(self._links.get(key, LinkFault()).delay_ms, True))

    def heal(self, a: str, b: str) -> None:
        self._links.pop(self._key(a, b), None)

    def heal_all(self) -> None:
        self._links.clear()

    def _set(self, key: frozenset[str], fault: LinkFault) -> None:
        if fault == LinkFault():
            self._links.pop(key, None)
        else:
            self._links[key] = fault

    def faults(self) -> dict[frozenset[str], LinkFault]:
        return dict(self._links)

    def nodes_touched(self) -> set[str]:
        return {n for key in self._links for n in key}

    def plan(self, node: str, ips: Mapping[str, str], enforces: Mapping[str, bool]) -> NodePlan:
        """``node``'s rules, given every node's IP and whether it can enforce faults (has
        iptables). A link between two nodes that cannot is refused when the fault is set."""
        rules: list[tuple[str, ...]] = []
        delays: dict[int, float] = {}
        for key, fault in sorted(self._links.items(), key=lambda kv: sorted(kv[0])):
            if node not in key or enforcer(key, enforces) != node:
                continue
            [peer] = key - {node}
            ip = ips[peer]
            if fault.cut:
                action: tuple[str, ...] = ("-j", "DROP")
            else:
                queue = len(delays) + 1
                delays[queue] = fault.delay_ms
                action = ("-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass")
            rules.append(("-d", ip, *action))
            rules.append(("-s", ip, *action))
        return NodePlan(tuple(rules), delays)


def enforcer(key: frozenset[str], enforces: Mapping[str, bool]) -> str:
    """The node of a link that holds its rules: the first by name that can."""
    able = sorted(n for n in key if enforces.get(n, False))
    if not able:
        raise ValueError(f"no node of {sorted(key)} can hold link faults (no iptables)")
    return able[0]


def script(plan: NodePlan) -> str:
    """A shell script (run as root in the node) that makes the namespace hold ``plan``: the
    rules replaced at once, the delaying process restarted with the new queues, waiting until it
    has bound them."""
    lines = [
        "set -e",
        f"iptables -N {CHAIN} 2>/dev/null || iptables -F {CHAIN}",
        f"iptables -C INPUT -j {CHAIN} 2>/dev/null || iptables -I INPUT -j {CHAIN}",
        f"iptables -C OUTPUT -j {CHAIN} 2>/dev/null || iptables -I OUTPUT -j {CHAIN}",
        "if [ -s /tmp/link_delay.pid ]; then kill $(cat /tmp/link_delay.pid) 2>/dev/null || true;"
        " rm -f /tmp/link_delay.pid; fi",
    ]
    lines += [f"iptables -A {CHAIN} {' '.join(rule)}" for rule in plan.rules]
    if plan.delays:
        queues = " ".join(f"{q}={ms:g}" for q, ms in sorted(plan.delays.items()))
        lines += [
            f"setsid python -m tidemq.testing.link_delay {queues} >/tmp/link_delay.log 2>&1 &",
            "echo $! >/tmp/link_delay.pid",
            "i=0; until grep -q holding /tmp/link_delay.log; do",
            "  i=$((i+1)); [ $i -lt 200 ] || { cat /tmp/link_delay.log; exit 1; }; sleep 0.05",
            "done",
        ]
    return "\n".join(lines) + "\n"
