"""Asymmetric network partitions of an automatic-failover group, each process in a network
namespace of its own (``partitioned``): ZooKeeper, the nameserver, three brokers and the
producing clients.

Whatever is cut, two things hold, checked from the producers' answers after the partition heals
and the group settles (``failover.check_history``): no two brokers of the group acknowledged
writes in one epoch, and every SEND_OK message is readable from the group's master. Each test
also checks what the partition itself should do: who acknowledges during it, and how soon the
cut-off master stops.

The cuts are firewall rules between namespaces, per direction; the last two tests cut only
ZooKeeper's answer to one write, right after it is committed (``zk_answer_cut``), which no rule
can time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import NameServerProcess
from tests.integration.failover import LEASE_MS, SESSION_MS, Group, check_history
from tests.integration.netns import network
from tests.integration.partitioned import Clients, Cluster
from tests.integration.zk_answer_cut import ZooKeeperAnswerCut
from tests.waiting import wait_until
from tidemq.services.broker.failover_znodes import GroupPaths, decode_state

pytestmark = pytest.mark.integration

QUEUES = 4
ROOT = "/partitions"


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with network() as net:
        c = Cluster(net, tmp_path)
        try:
            yield c
        finally:
            c.stop(request)


def running_group(cluster: Cluster) -> tuple[Group, NameServerProcess, Clients]:
    """Brokers 1-3 elected and in sync, topic "orders" routed, the clients acknowledged."""
    zk = cluster.start_zookeeper()
    group = Group(cluster.start_broker, zk, ROOT)
    ns = group.routed(cluster.start_nameserver, "orders", QUEUES)
    clients = cluster.start_clients(ns, "orders")
    clients.wait_acknowledged(20)
    return group, ns, clients


def node(broker_id: int) -> str:
    return f"broker-a-{broker_id}"


def settle_and_check(cluster: Cluster, group: Group, clients: Clients) -> None:
    """After the heal: every broker in sync again, the clients stopped, the history held to
    what the group promised."""
    group.wait_isr({1, 2, 3}, timeout_s=30)
    history = clients.stop()
    check_history(history, group, "orders", QUEUES)


@pytest.mark.parametrize("way", ["both ways", "zookeeper to master", "master to zookeeper"])
def test_a_master_cut_off_from_zookeeper_stops_acknowledging_within_its_lease(
    cluster: Cluster, way: str
) -> None:
    """Clients and slaves still reach the old master; ZooKeeper does not (or only one way).
    The old master stops acknowledging within its lease of the cut, a slave takes over at the
    next epoch, and the old master follows it once the network heals."""
    group, _, clients = running_group(cluster)
    old = group.master()
    old_address = group.brokers[old].address
    if way != "master to zookeeper":
        cluster.net.cut("zk", node(old))
    if way != "zookeeper to master":
        cluster.net.cut(node(old), "zk")
    cut_at = time.monotonic()
    new = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=old)
    clients.wait_acknowledged(len(clients.acknowledged()) + 20)
    lease_over = cut_at + LEASE_MS / 1000
    late = [
        a for a in clients.acknowledged_sends_started_after(lease_over) if a.broker == old_address
    ]
    assert not late, f"the cut-off master acknowledged {len(late)} sends after its lease"
    # Still reachable by its clients, it answers them, but acknowledges nothing.
    assert not group.failover(old).acknowledging
    assert group.failover(new).group_epoch == 2
    acked = clients.acknowledged()
    last_old = max(a.at for a in acked if a.broker == old_address)
    first_new = min(a.at for a in acked if a.broker == group.brokers[new].address)
    print(f"{way}: no acknowledgement for {first_new - last_old:.2f} s")
    cluster.net.heal()
    wait_until(
        lambda: (group.failover(old).role, group.failover(old).master_id) == ("SLAVE", new),
        30,
        "the old master to follow the new one",
    )
    settle_and_check(cluster, group, clients)


def test_a_master_its_slaves_cannot_reach_keeps_its_epoch_and_acknowledges_nothing_alone(
    cluster: Cluster,
) -> None:
    """ZooKeeper and the clients reach the master, its slaves do not (nor does it reach them):
    SYNC sends cannot be replicated. The master keeps its lease, so no slave takes over; it
    drops the slaves from the in-sync set and, with fewer in-sync slaves than
    ``min_insync_replicas`` (1), answers SLAVE_NOT_AVAILABLE: stored, never SEND_OK. After the
    heal the slaves catch up and rejoin, and the same master acknowledges in the same epoch."""
    group, _, clients = running_group(cluster)
    old = group.master()
    old_address = group.brokers[old].address
    for s in (i for i in (1, 2, 3) if i != old):
        cluster.net.cut_both(node(old), node(s))
    cut_at = time.monotonic()
    group.wait_isr({old}, timeout_s=30)
    shrunk_at = time.monotonic()
    wait_until(
        lambda: any(
            a.status == "SLAVE_NOT_AVAILABLE" and a.at > shrunk_at for a in clients.poll().answers
        ),
        30,
        "the master to answer a send with the in-sync set shrunk",
    )
    assert {group.failover(i).group_epoch for i in (1, 2, 3)} == {1}
    during = clients.acknowledged_sends_started_after(cut_at)
    assert not during, f"{len(during)} sends acknowledged without a slave holding them"
    cluster.net.heal()
    healed = len(clients.acknowledged())
    clients.wait_acknowledged(healed + 20)
    assert {(a.broker, a.epoch) for a in clients.acknowledged()[healed:]} == {(old_address, 1)}
    settle_and_check(cluster, group, clients)


@pytest.mark.parametrize("way", ["both ways", "master to slave", "slave to master"])
def test_a_slave_that_reaches_zookeeper_but_not_the_master_leaves_the_in_sync_set_and_rejoins(
    cluster: Cluster, way: str
) -> None:
    """One slave is cut from the master (or only one way) but reaches ZooKeeper: it sees the
    master's leader znode, so it does not stand for election; the master drops it from the
    in-sync set and acknowledges with the other slave. After the heal it catches up and
    rejoins."""
    group, _, clients = running_group(cluster)
    old = group.master()
    cut_off, other = (i for i in (1, 2, 3) if i != old)
    if way != "slave to master":
        cluster.net.cut(node(old), node(cut_off))
    if way != "master to slave":
        cluster.net.cut(node(cut_off), node(old))
    cut_at = time.monotonic()
    group.wait_isr({old, other}, timeout_s=30)
    clients.wait_acknowledged(len(clients.acknowledged()) + 20)
    assert {group.failover(i).group_epoch for i in (1, 2, 3)} == {1}
    during = clients.acknowledged_sends_started_after(cut_at)
    assert {(a.broker, a.epoch) for a in during} == {(group.brokers[old].address, 1)}
    cluster.net.heal()
    settle_and_check(cluster, group, clients)


def test_a_master_that_reaches_only_zookeeper_keeps_the_group_and_acknowledges_nothing(
    cluster: Cluster,
) -> None:
    """The master reaches ZooKeeper and nothing else: neither its clients nor its slaves reach
    it. It keeps its lease, so no slave takes over (one would acknowledge writes the master's
    clients never see), and no client gets a SEND_OK from anyone while it lasts. After the heal
    the clients are acknowledged by the same master in the same epoch."""
    group, _, clients = running_group(cluster)
    old = group.master()
    old_address = group.brokers[old].address
    for other in ("clients", *(node(i) for i in (1, 2, 3) if i != old)):
        cluster.net.cut_both(node(old), other)
    cut_at = time.monotonic()
    # The in-sync set shrinks after isr_max_lag_ms: by then a session timeout has long passed,
    # and a slave that meant to take over would have.
    group.wait_isr({old}, timeout_s=30)
    assert {group.failover(i).group_epoch for i in (1, 2, 3)} == {1}
    assert group.failover(old).acknowledging
    during = clients.acknowledged_sends_started_after(cut_at)
    assert not during, f"{len(during)} sends acknowledged while the master was unreachable"
    cluster.net.heal()
    healed = len(clients.acknowledged())
    clients.wait_acknowledged(healed + 20)
    assert {(a.broker, a.epoch) for a in clients.acknowledged()[healed:]} == {(old_address, 1)}
    settle_and_check(cluster, group, clients)


@contextlib.contextmanager
def group_behind_answer_cut(
    cluster: Cluster,
) -> Iterator[tuple[Group, ZooKeeperAnswerCut, Clients, str]]:
    """``running_group`` with the brokers reaching ZooKeeper through a ``ZooKeeperAnswerCut``
    (the nameserver directly); also the path of the group's state znode."""
    zk = cluster.start_zookeeper()
    proxy = ZooKeeperAnswerCut(cluster.net.observer_ip, zk.hosts)
    try:
        # The last --zk flag wins.
        group = Group(cluster.start_broker, zk, ROOT, extra=("--zk", proxy.hosts))
        ns = group.routed(cluster.start_nameserver, "orders", QUEUES)
        clients = cluster.start_clients(ns, "orders")
        clients.wait_acknowledged(20)
        yield group, proxy, clients, GroupPaths.of(ROOT, "DefaultCluster", group.name).state
    finally:
        proxy.close()


def ip(cluster: Cluster, broker_id: int) -> str:
    return cluster.net.nodes[node(broker_id)].ip


def test_a_master_that_never_hears_zookeeper_accept_its_in_sync_set_change_still_applies_it(
    cluster: Cluster,
) -> None:
    """One slave is cut off from the master; the master drops it from the in-sync set, and
    ZooKeeper's answer to that write is lost on the way back (the master still reaches
    ZooKeeper, so its session lives on). The write is committed: once the master hears from
    ZooKeeper again it must wait for the slaves ZooKeeper lists, not for the dropped one, or
    every SYNC send waits for a slave nobody counts any more."""
    with group_behind_answer_cut(cluster) as (group, proxy, clients, state):
        old = group.master()
        cut_off, other = (i for i in (1, 2, 3) if i != old)
        answer_lost = proxy.cut_answers_after_write(state, ip(cluster, old))
        cluster.net.cut_both(node(old), node(cut_off))
        wait_until(answer_lost.is_set, 30, "the master to write the in-sync set")
        with group.zk.client() as zk_client:
            assert decode_state(zk_client.get(state)[0]).isr == {old, other}
        lost_at = time.monotonic()
        clients.wait_acknowledged(len(clients.acknowledged()) + 20, timeout_s=20)
        during = clients.acknowledged_sends_started_after(lost_at)
        assert {(a.broker, a.epoch) for a in during} == {(group.brokers[old].address, 1)}
        cluster.net.heal()
        settle_and_check(cluster, group, clients)


def test_a_slave_that_never_hears_zookeeper_accept_its_election_lets_go_and_is_elected_again(
    cluster: Cluster,
) -> None:
    """The master is killed; the slave that wins the election never hears ZooKeeper accept its
    transaction (the answer is lost; it still reaches ZooKeeper, so its session, and the leader
    znode the transaction created, live on). It must not wait forever for that leader znode to
    go as if an earlier process of its own held it: it lets go, and the group elects again."""
    with group_behind_answer_cut(cluster) as (group, proxy, clients, state):
        old = group.master()
        slaves = [i for i in (1, 2, 3) if i != old]
        answer_lost = proxy.cut_answers_after_write(state, *(ip(cluster, i) for i in slaves))
        group.kill(old)
        wait_until(answer_lost.is_set, 30, "a slave to write its election")
        new = group.master(timeout_s=30, not_id=old)
        assert group.failover(new).group_epoch >= 3, "the lost election was not the last one"
        clients.wait_acknowledged(len(clients.acknowledged()) + 20)
        group.start(old)
        settle_and_check(cluster, group, clients)
