"""Automatic failover (a real ZooKeeper, three brokers electing their master) under receive/ack
load. Two consumer groups read the same topic at once: ``plain`` and ``ordered`` (FIFO message
groups). The master is SIGKILLed mid-load; a slave takes over and the members follow it.

Under SYNC_MASTER every answer a member got (a delivery, an ack) was on a slave when it was
given, so: every SEND_OK message is acked by each group, none is lost, no acked message is
delivered again (the window of duplicates is zero), and each message group's order holds
across the failover.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.failover import SESSION_MS, Group
from tests.integration.receive_checks import (
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    fifo_violations,
    next_delivery,
    overlaps,
)
from tests.integration.receivers import (
    Action,
    Delivery,
    DeliveryLog,
    Senders,
    SendLog,
    configure_group,
    members,
    record_delivery,
    simple_consumer,
    wait_all_done,
    wall_ms,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 4
KEYS = [f"k{i}" for i in range(8)]
HOLD_MS = 3_000


@pytest.fixture
def group(start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(start_broker, zookeeper, zk_root)
    yield g
    g.thaw_all()


def knows_fifo(g: Group, consumer_group: str) -> bool:
    """Every live broker (slaves by config sync) has the group's FIFO setting."""
    for b in g.live().values():
        try:
            r = b.stub().GetConsumerGroup(
                broker_pb2.GetConsumerGroupRequest(group=consumer_group), timeout=5
            )
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # not synced yet
                raise
            return False
        if not r.group.settings.fifo:
            return False
    return True


def light_failures(message: Any) -> tuple[Action, float]:
    """About 10% nacked and 5% dropped on their first delivery, the rest acked."""
    roll = zlib.crc32(message.body + b"#%d" % message.delivery_attempt) % 100
    if message.delivery_attempt == 1 and roll < 10:
        return Action.NACK, 0.0
    if message.delivery_attempt == 1 and roll < 15:
        return Action.DROP, 0.0
    return Action.ACK, 0.0


def hold(ns: str, consumer_group: str, log: DeliveryLog) -> list[Delivery]:
    """A member that takes a few messages and dies with them (never acks): in flight at the
    failover."""
    with simple_consumer(ns, consumer_group, TOPIC) as holder:
        got = holder.receive(max_messages=4, invisible_duration_s=HOLD_MS / 1000, timeout_s=5)
        return [record_delivery(log, f"{consumer_group}-holder", m, HOLD_MS) for m in got]


def test_failover_under_receive_load_loses_no_message_and_delivers_no_acked_one_again(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, QUEUES, "--config-sync-interval-ms", "500")
    configure_group(ns, "plain", retry_delays_s=[1.0])
    configure_group(ns, "ordered", retry_delays_s=[1.0], fifo=True)
    # A slave that became master without knowing "ordered" is FIFO would break its order.
    wait_until(lambda: knows_fifo(group, "ordered"), 20, "every broker to know the FIFO group")
    sent = SendLog()
    logs = {"plain": DeliveryLog(), "ordered": DeliveryLog()}
    consumers = {
        name: members(2, ns.address, name, TOPIC, log, plan=light_failures, invisible_s=2.0)
        for name, log in logs.items()
    }
    first = group.master()
    senders = Senders(ns.address, TOPIC, [KEYS[:4], KEYS[4:]], None, sent, interval_s=0.05)
    with consumers["plain"], consumers["ordered"], senders:
        wait_until(
            lambda: (
                all(m.healthy() for m in consumers.values())
                and all(len(log.done_bodies()) >= 100 for log in logs.values())
            ),
            40,
            "100 acks in each group",
        )
        held = {name: hold(ns.address, name, log) for name, log in logs.items()}
        killed_at = wall_ms()
        group.kill(first)
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        failed_over_at = wall_ms()
        wait_until(
            lambda: senders.healthy() and sent.ok_since(failed_over_at) >= 100,
            30,
            "100 sends acknowledged by the new master",
        )
        senders.stop.set()
        wait_until(senders.finished, 30, "the senders to stop")
        for name, log in logs.items():
            wait_all_done(log, sent, consumers[name], 40, f" by {name}")
    assert second != first
    figures = []
    for name, log in logs.items():
        assert_every_sent_message_acked(sent.bodies(), log)
        dups = duplicates(log)
        figures.append(
            f"{name}: deliveries {len(log.deliveries())}, duplicates {len(dups)}, redelivered"
            f" {sum(d.attempt > 1 for d in log.deliveries())}, held at the kill"
            f" {len(held[name])}, member errors {len(consumers[name].errors())}"
        )
        assert_clean(dups, f"acked messages of {name} delivered again")
        assert_clean(overlaps(log), f"{name} deliveries while another one held the message")
        assert_clean(attempt_problems(log, exact=False), f"{name} attempt counts wrong")
        for h in held[name]:
            again = next_delivery(log, h)
            assert again.attempt == h.attempt + 1, f"{again} after {h}"
            assert again.received_at_ms > failed_over_at, f"{again} before the failover"
    assert held["plain"], "the holder got nothing to hold"
    assert_clean(
        fifo_violations(logs["ordered"]), "messages delivered before the one in front was acked"
    )
    print(
        f"failover took {failed_over_at - killed_at:.0f} ms; sent {len(sent.bodies())},"
        f" not SEND_OK {len(sent.failed)}; " + "; ".join(figures)
    )
