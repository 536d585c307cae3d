"""Automatic failover with real broker processes on a real ZooKeeper: a group elects its master,
a dead or frozen master is replaced within seconds, producers follow, and nothing acknowledged
is lost or served from diverging copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import tidemq
from tests.integration.conftest import NameServerProcess, StartNameServer
from tests.integration.failover import (
    SESSION_MS,
    Group,
    History,
    Producers,
    check_history,
    group_fixture,  # noqa: F401 - the group fixture
)
from tests.integration.replicas import log_epoch, max_offset, pull_queue
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

QUEUES = 4


def three_brokers(
    group: Group,
    start_nameserver: StartNameServer,
    zookeeper: ZooKeeperServer,
    zk_root: str,
    *flags: str,
) -> tuple[tidemq.Admin, NameServerProcess]:
    """Brokers 1-3 of one group, elected at epoch 1 and all in sync, topic "orders" routed."""
    ns = group.routed(start_nameserver, "orders", QUEUES, *flags)
    assert group.failover(group.master()).group_epoch == 1
    return tidemq.Admin(ns.address), ns


def test_a_group_elects_one_master_and_replaces_it_when_it_is_killed(
    group: Group, start_nameserver: StartNameServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    admin, ns = three_brokers(group, start_nameserver, zookeeper, zk_root)
    first = group.master()
    history = History()
    with Producers(ns, "orders", history) as producers:
        producers.wait_acknowledged(50)
        killed_at = time.monotonic()
        group.kill(first)
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        before = len(history.acknowledged())
        producers.wait_acknowledged(before + 50)
    assert second != first
    assert group.failover(second).group_epoch == 2
    after_kill = [a for a in history.acknowledged() if a.at > killed_at]
    assert after_kill and all(a.epoch == 2 for a in after_kill[-10:])
    route = admin.route("orders")
    assert route.groups[group.name].epoch == 2
    assert route.groups[group.name].master == group.brokers[second].address
    # The killed broker comes back as a slave of the new master and converges.
    group.start(first)
    assert group.master() == second
    group.wait_isr({1, 2, 3})
    check_history(history, group, "orders", QUEUES)
    admin.close()


def test_a_frozen_master_acknowledges_nothing_after_it_resumes(
    group: Group, start_nameserver: StartNameServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    admin, ns = three_brokers(group, start_nameserver, zookeeper, zk_root)
    first = group.master()
    old_address = group.brokers[first].address
    history = History()
    with Producers(ns, "orders", history) as producers:
        producers.wait_acknowledged(50)
        group.freeze(first)
        frozen_at = time.monotonic()
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        producers.wait_acknowledged(len(history.acknowledged()) + 30)
        thawed_at = time.monotonic()
        group.thaw(first)
        # It finds out it was replaced and follows the new master.
        wait_until(
            lambda: (
                group.failover(first).role == "SLAVE" and group.failover(first).master_id == second
            ),
            30,
            "the old master to follow the new one",
        )
        producers.wait_acknowledged(len(history.acknowledged()) + 30)
    late = [a for a in history.acknowledged() if a.broker == old_address and a.at > thawed_at]
    assert not late, f"the old master acknowledged {len(late)} sends after it resumed"
    assert all(a.epoch >= 2 for a in history.acknowledged() if a.at > thawed_at + 1)
    assert frozen_at < thawed_at
    group.wait_isr({1, 2, 3})
    check_history(history, group, "orders", QUEUES)
    admin.close()


def test_an_old_master_truncates_its_unacknowledged_tail_when_it_rejoins(
    group: Group, start_nameserver: StartNameServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    """The master is left alone (its slaves killed), appends what it cannot get acknowledged,
    and dies; with unclean election on, a slave that never saw that tail takes over. The old
    master rejoins: it cuts the tail back to where the epoch files say the logs part, keeps it
    as evidence, and ends up identical to the new master."""
    admin, ns = three_brokers(
        group, start_nameserver, zookeeper, zk_root, "--unclean-election", "--confirm-offset"
    )
    first = group.master()
    others = [i for i in (1, 2, 3) if i != first]
    with tidemq.Producer(ns.address) as producer:
        assert producer.send("orders", "replicated", sharding_key="k").ok
    group.wait_converged()
    for i in others:
        group.kill(i)
    group.wait_isr({first})
    with tidemq.Producer(ns.address) as producer:
        tail = [producer.send("orders", f"tail-{n}", sharding_key="k") for n in range(5)]
    assert {r.status for r in tail} == {tidemq.SendStatus.SLAVE_NOT_AVAILABLE}  # stored only
    tail_end = max_offset(group.brokers[first])
    # confirm_offset: no slave holds the tail, so consumers of the old master never see it
    # (the failover below takes it back).
    shown = [body for _, body in pull_queue(group.brokers[first], tail[0].queue_id)]
    assert shown == [b"replicated"]
    assert log_epoch(group.brokers[first], tail[0].queue_id) == 1
    group.kill(first)
    for i in others:
        group.start(i)
    second = group.master(timeout_s=30)
    assert second in others
    assert max_offset(group.brokers[second]) < tail_end
    assert group.failover(second).group_epoch == 2
    group.start(first)
    wait_until(lambda: group.failover(first).master_id == second, 30, "the old master to follow")
    group.wait_converged()
    evidence = [p for p in (group.brokers[first].store_dir / "evidence").rglob("*") if p.is_file()]
    assert evidence, "the cut tail was not kept as evidence"
    assert b"tail-4" in b"".join(p.read_bytes() for p in evidence)
    # Converged logs are not yet an in-sync set: the master adds caught-up slaves at its next
    # tick, and until then a SYNC send is answered SLAVE_NOT_AVAILABLE.
    group.wait_isr({1, 2, 3})
    with tidemq.Producer(ns.address) as producer:
        assert producer.send("orders", "after").ok
    # Its pulls answer the epoch its log, cut back, grows under now, so a consumer that read the
    # cut tail from it checks its position instead of going on past the records that replaced it.
    assert log_epoch(group.brokers[first], tail[0].queue_id) == 2
    admin.close()


def test_a_planned_switchover_hands_over_without_losing_an_acknowledged_send(
    group: Group, start_nameserver: StartNameServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    admin, ns = three_brokers(group, start_nameserver, zookeeper, zk_root)
    first = group.master()
    target = next(i for i in (1, 2, 3) if i != first)
    history = History()
    with Producers(ns, "orders", history) as producers:
        producers.wait_acknowledged(30)
        out = subprocess.run(
            [sys.executable, "-m", "tidemq.cli", "group", "switchover", group.name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "TIDEMQ_NAMESERVER": ns.address},
        )
        assert out.returncode == 2, out.stderr  # --to is required
        out = subprocess.run(
            [
                *(sys.executable, "-m", "tidemq.cli", "broker-group", "switchover", group.name),
                *("--to", str(target), "--json", "--nameserver", ns.address),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        result = json.loads(out.stdout)
        producers.wait_acknowledged(len(history.acknowledged()) + 30)
    assert (result["master_id"], result["epoch"]) == (target, 2)
    assert 0 < result["writes_paused_ms"] < 10_000
    assert group.master() == target
    # A switchover to a broker outside the in-sync set is refused, typed, and changes nothing.
    with pytest.raises(tidemq.errors.TidemqError, match="not in the in-sync set"):
        admin.switchover(group.name, 7)
    assert group.master() == target
    check_history(history, group, "orders", QUEUES)
    admin.close()


def test_a_whole_group_restarted_at_once_keeps_every_acknowledged_message(
    group: Group, start_nameserver: StartNameServer, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    """RocketMQ #7689: a restarted master recovered only to its confirm offset and then reused
    queue offsets of messages it had acknowledged. Here every broker of the group is SIGKILLed
    under load and restarted: the best of them is elected, keeps its whole log, and new sends
    get new queue offsets after everything acknowledged before."""
    admin, ns = three_brokers(group, start_nameserver, zookeeper, zk_root)
    history = History()
    with Producers(ns, "orders", history) as producers:
        producers.wait_acknowledged(100)
        for i in (1, 2, 3):
            group.kill(i)
        before = history.acknowledged()
        for i in (1, 2, 3):
            group.start(i)
        group.master(timeout_s=SESSION_MS / 1000 + 30)
        producers.wait_acknowledged(len(history.acknowledged()) + 100)
    assert group.failover(group.master()).group_epoch >= 2
    group.wait_isr({1, 2, 3})
    check_history(history, group, "orders", QUEUES)
    # Queue offsets were never handed out twice: per queue, every acknowledged offset is unique.
    seen: dict[tuple[int, int], str] = {}
    for a in history.acknowledged():
        other = seen.setdefault((a.queue_id, a.queue_offset), a.body)
        assert other == a.body, f"queue {a.queue_id} offset {a.queue_offset}: {other} and {a.body}"
    assert len(before) >= 100
    admin.close()
