"""The routes a snapshot of the brokers' znodes describes. Pure: no ZooKeeper, no clock, so the
rules are unit-tested from hand-built snapshots; ``zk_registry`` reads the snapshots.

A fresh ``RouteTable`` is built from each snapshot (``build_route_table``): the znodes are applied
in creation order (czxid) with each broker's last-update time taken from its znode's mtime, so
every nameserver that has read the same znodes answers QueryRoute and GetClusterInfo
identically, byte for byte, however its watch events interleaved.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_table import (
    BrokerRegistration,
    RegistrationRejected,
    RouteTable,
)


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


def build_route_table(znodes: Iterable[BrokerZnode]) -> tuple[RouteTable, dict[str, str]]:
    """The routes ``znodes`` describe, and why each znode left out was left out (path -> why).

    Depends only on the set of znodes, never on their order: they are applied oldest first
    (czxid), so where two claim the same address the newer wins, as a newer heartbeat would.
    Two passes: the second applies every registration again once each group's highest epoch is
    known, so a master with a stale epoch is fenced whichever znode was created first.
    """
    problems: dict[str, str] = {}
    accepted: list[tuple[BrokerZnode, BrokerRegistration]] = []
    for znode in sorted(znodes, key=lambda z: (z.czxid, z.path)):
        if znode.ephemeral_owner == 0:
            problems[znode.path] = "not ephemeral: it would keep its broker routed forever"
            continue
        try:
            name = zk_format.parse_node_name(znode.cluster, znode.broker_name, znode.broker_id)
            accepted.append((znode, zk_format.decode_registration(name, znode.data)))
        except zk_format.ZnodeDataError as e:
            problems[znode.path] = str(e)

    table = RouteTable()
    refused: dict[str, str] = {}
    for _ in range(2):
        refused = {}
        for znode, reg in accepted:
            try:
                table.register(reg, znode.mtime_ms)
            except RegistrationRejected as e:
                refused[znode.path] = str(e)
    problems.update(refused)
    for znode, reg in accepted:
        if znode.path not in problems:
            ref = table.lookup(reg.address)
            if ref is None or (ref.cluster, ref.broker_name, ref.broker_id) != (
                reg.cluster,
                reg.broker_name,
                reg.broker_id,
            ):
                problems[znode.path] = f"address {reg.address} is claimed by a newer znode"
    # A group whose master's znode is gone keeps serving reads from its slaves, as the embedded
    # registry does: the lowest id's topics, applied last, win.
    for znode, reg in sorted(accepted, key=lambda a: -a[1].broker_id):
        if znode.path not in problems:
            table.serve_reads_from_slave(reg)
    return table, problems


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
