"""The routes a set of broker znodes describes. Pure: no ZooKeeper, no clock, so the rules are
unit-tested from hand-built snapshots; ``zk_view`` keeps the znodes up to date and applies topic
shard changes in place between rebuilds.

A fresh ``RouteTable`` is built from the leaves (``table_from``): they are applied in creation
order (czxid) with each broker's last-update time taken from its leaf's mtime, so every
nameserver holding the same znodes answers QueryRoute and GetClusterInfo identically, byte for
byte, however its watch events interleaved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    RegistrationRejected,
    TopicQueues,
)
from tidemq.services.nameserver.route_table import RouteTable


@dataclass(frozen=True)
class BrokerZnode:
    """One leaf as read: where it is, what it holds, and the stat fields the rebuild uses."""

    cluster: str
    broker_name: str
    broker_id: str  # the znode's name, not yet checked
    data: bytes
    czxid: int  # creation order across the whole ensemble
    mtime_ms: int  # when it was last written: the broker's last-update time
    ephemeral_owner: int  # session id; 0 for a persistent znode

    @property
    def path(self) -> str:
        return f"{self.cluster}/{self.broker_name}/{self.broker_id}"


@dataclass(frozen=True)
class Candidate:
    """A valid leaf with the topics it registers (inline, or from its shards)."""

    path: str
    czxid: int
    mtime_ms: int
    registration: BrokerRegistration


@dataclass
class Routes:
    table: RouteTable
    problems: dict[str, str] = field(default_factory=dict)  # leaf path -> why it is left out
    # Group name -> the path of the leaf whose topics are the group's queue data: its master,
    # or, in a group without one, its lowest slave. Only these leaves' shards move the table.
    sources: dict[str, str] = field(default_factory=dict)


def decode_leaf(znode: BrokerZnode) -> zk_format.Leaf:
    """``znode``'s content; ZnodeDataError when it cannot be served."""
    if znode.ephemeral_owner == 0:
        raise zk_format.ZnodeDataError("not ephemeral: it would keep its broker routed forever")
    name = zk_format.parse_node_name(znode.cluster, znode.broker_name, znode.broker_id)
    return zk_format.decode_leaf(name, znode.data)


def build_route_table(
    znodes: Iterable[BrokerZnode],
    shard_topics: Mapping[str, Iterable[TopicQueues]] | None = None,
) -> tuple[RouteTable, dict[str, str]]:
    """The routes ``znodes`` describe, and why each znode left out was left out (path -> why).
    ``shard_topics`` holds the topics of format-2 leaves by path (none when absent)."""
    problems: dict[str, str] = {}
    candidates = []
    for znode in znodes:
        try:
            leaf = decode_leaf(znode)
        except zk_format.ZnodeDataError as e:
            problems[znode.path] = str(e)
            continue
        reg = leaf.registration
        if not leaf.inline:
            reg = replace(reg, topics=tuple((shard_topics or {}).get(znode.path, ())))
        candidates.append(Candidate(znode.path, znode.czxid, znode.mtime_ms, reg))
    routes = table_from(candidates)
    routes.problems.update(problems)
    return routes.table, routes.problems


def table_from(candidates: Iterable[Candidate]) -> Routes:
    """The routes of valid leaves. Depends only on the set of leaves, never on their order:
    they are applied oldest first (czxid), so where two claim the same address the newer wins,
    as a newer heartbeat would. Two passes: the second applies every registration again once
    each group's highest epoch is known, so a master with a stale epoch is fenced whichever
    leaf was created first."""
    accepted = sorted(candidates, key=lambda c: (c.czxid, c.path))
    table = RouteTable()
    refused: dict[str, str] = {}
    for _ in range(2):
        refused = {}
        for c in accepted:
            try:
                table.register(c.registration, c.mtime_ms)
            except RegistrationRejected as e:
                refused[c.path] = str(e)
    routes = Routes(table, refused)
    served = []
    for c in accepted:
        if c.path in refused:
            continue
        reg = c.registration
        ref = table.lookup(reg.address)
        if ref is None or (ref.cluster, ref.broker_name, ref.broker_id) != (
            reg.cluster,
            reg.broker_name,
            reg.broker_id,
        ):
            routes.problems[c.path] = f"address {reg.address} is claimed by a newer znode"
        else:
            served.append(c)
    # A group whose master's leaf is gone keeps serving reads from its slaves, as the embedded
    # registry does: the lowest id's topics, applied last, win.
    for c in sorted(served, key=lambda c: -c.registration.broker_id):
        table.serve_reads_from_slave(c.registration)
        routes.sources[c.registration.broker_name] = c.path
    return routes


def routes_view(table: RouteTable) -> tuple[object, ...]:
    """Everything a client can see of a table, comparable with ==."""
    return (table.cluster_info(), [table.route(t) for t in table.topics()])


def members(table: RouteTable) -> set[tuple[str, str, int, str]]:
    """(cluster, broker name, broker id, address) of every broker a table routes."""
    return {
        (
            b.registration.cluster,
            b.registration.broker_name,
            b.registration.broker_id,
            b.registration.address,
        )
        for c in table.cluster_info()
        for b in c.brokers
    }
