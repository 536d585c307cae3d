"""Automatic failover (a real ZooKeeper, three brokers electing their master) under receive/ack
load. Two consumer groups read the same topic at once: ``plain`` and ``ordered`` (FIFO message
groups). The master is SIGKILLed mid-load; a slave takes over and the members follow it.

Under SYNC_MASTER every answer a member got (a delivery, an ack) was on a slave when it was
given, so: every SEND_OK message is acked by each group, none is lost, no acked message is
delivered again (the window of duplicates is zero), and each message group's order holds
across the failover.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.failover import SESSION_MS, Group
from tests.integration.receive_checks import (
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    fifo_violations,
    overlaps,
)
from tests.integration.receivers import (
    DeliveryLog,
    Members,
    Senders,
    SendLog,
    configure_group,
    members,
    wait_all_done,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 4
KEYS = [f"k{i}" for i in range(8)]


@pytest.fixture
def group(start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(start_broker, zookeeper, zk_root)
    yield g
    g.thaw_all()


def knows_fifo(g: Group, consumer_group: str) -> bool:
    """Every live broker (slaves by config sync) has the group's FIFO setting."""
    for b in g.live().values():
        r = b.stub().GetConsumerGroup(
            broker_pb2.GetConsumerGroupRequest(group=consumer_group), timeout=5
        )
        if not r.group.settings.fifo:
            return False
    return True


def test_failover_under_receive_load_loses_no_message_and_delivers_no_acked_one_again(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, QUEUES, "--config-sync-interval-ms", "500")
    configure_group(ns, "plain", retry_delays_s=[1.0])
    configure_group(ns, "ordered", retry_delays_s=[1.0], fifo=True)
    # A slave that became master without knowing "ordered" is FIFO would break its order.
    wait_until(lambda: knows_fifo(group, "ordered"), 20, "every broker to know the FIFO group")
    sent = SendLog()
    plain, ordered = DeliveryLog(), DeliveryLog()
    consumers = {
        "plain": (plain, members(2, ns.address, "plain", TOPIC, plain, invisible_s=2.0)),
        "ordered": (ordered, members(2, ns.address, "ordered", TOPIC, ordered, invisible_s=2.0)),
    }
    first = group.master()
    senders = Senders(ns.address, TOPIC, [KEYS[:4], KEYS[4:]], 50, sent, interval_s=0.05)
    with consumers["plain"][1], consumers["ordered"][1], senders:
        every: list[Members] = [m for _, m in consumers.values()]
        wait_until(
            lambda: (
                all(m.healthy() for m in every)
                and len(plain.done_bodies()) >= 100
                and len(ordered.done_bodies()) >= 100
            ),
            40,
            "100 acks in each group",
        )
        killed_at = time.time() * 1000
        group.kill(first)
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        failed_over_at = time.time() * 1000
        wait_until(senders.finished, 60, "the sends")
        for name, (log, m) in consumers.items():
            wait_all_done(log, sent, m, 40, f" by {name}")
    assert second != first
    assert len(sent.bodies()) >= 300, sent.failed[:5]
    figures = []
    for name, (log, m) in consumers.items():
        assert_every_sent_message_acked(sent.bodies(), log)
        dups = duplicates(log)
        after = [d for d in log.deliveries() if d.received_at_ms > failed_over_at]
        assert after, f"{name}: nothing delivered by the new master"
        figures.append(
            f"{name}: deliveries {len(log.deliveries())}, duplicates {len(dups)},"
            f" redelivered {sum(d.attempt > 1 for d in log.deliveries())},"
            f" member errors {len(m.errors())}"
        )
        assert_clean(dups, f"acked messages of {name} delivered again")
        assert_clean(overlaps(log), f"{name} deliveries while another one held the message")
        assert_clean(attempt_problems(log, exact=False), f"{name} attempt counts wrong")
    assert_clean(fifo_violations(ordered), "messages delivered before the one in front was acked")
    print(
        f"failover took {failed_over_at - killed_at:.0f} ms; sent {len(sent.bodies())},"
        f" failed sends {len(sent.failed)}; " + "; ".join(figures)
    )
