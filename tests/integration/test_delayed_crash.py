"""Delayed delivery across a SIGKILL of the master (restarted on the same store) and across
an automatic failover: 10,000 messages with random delays of 0-20 s, the fault when a fifth
of them is due. None is lost, none is visible before its time; those due while a master
served arrive within a second (p99); those due while none did arrive within a second of one
serving again (the new master delivers its predecessor's timers: they are in its replicated
log)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

import tidemq
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.delayed import Schedule, lateness_report, p99, stored, stored_count
from tests.integration.failover import Group, group_fixture  # noqa: F401 - the group fixture
from tests.integration.replicas import (
    ONE_MIB_FILES,
    SLAVE_FLAGS,
    create_topic,
    start,
    topic_names,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 4
COUNT = 10_000
SPREAD_S = 20.0
# The fault comes when this share of the schedule is due: most of it falls due after the
# fault, however long the sends took on a busy machine.
FAULT_AT_SHARE = 0.2


def delays(seed: int) -> list[float]:
    rnd = random.Random(seed)
    return [rnd.uniform(0, SPREAD_S) for _ in range(COUNT)]


def sleep_until_fault(schedule: Schedule) -> None:
    due = sorted(schedule.due.values())
    fault_at_s = due[int(len(due) * FAULT_AT_SHARE)] / 1000
    time.sleep(max(0.0, fault_at_s - time.time()))


def wait_delivered(
    broker_of: Callable[[], BrokerProcess], due: dict[bytes, int], timeout_s: float
) -> None:
    def done() -> bool:
        try:
            return stored_count(broker_of(), TOPIC) >= len(due)
        except Exception:  # noqa: BLE001 - a broker still starting: look again
            return False

    wait_until(done, timeout_s, "every delayed message delivered")


def test_sigkill_of_the_master_loses_no_delayed_message_and_delivers_on_time_after_restart(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master, TOPIC)
    slave = start(start_broker, nameserver, "slave", *SLAVE_FLAGS)
    wait_until(lambda: TOPIC in topic_names(slave), 30, "the slave to learn the topic")
    schedule = Schedule()
    with tidemq.Producer(nameserver.address) as producer:
        schedule.send(producer, TOPIC, delays(1))
    sleep_until_fault(schedule)
    down_at = time.time() * 1000
    master.kill()
    port = int(master.address.rsplit(":", 1)[1])
    master = start_broker(
        *("--nameserver", nameserver.address, "--broker-name", "group-a"),
        *("--register-interval-ms", "500", "--store-overrides", ONE_MIB_FILES),
        store="master",
        port=port,
    )
    up_at = time.time() * 1000
    assert sum(at > up_at for at in schedule.due.values()) > COUNT // 3
    wait_delivered(lambda: master, schedule.due, SPREAD_S + 20)
    seen = stored(master, TOPIC, QUEUES)
    problems, late, after = lateness_report(schedule.due, seen, (down_at, up_at))
    assert not problems, problems[:10]
    assert not after, after[:10]
    assert p99(late) <= 1_000, f"p99 lateness {p99(late)} ms (max {max(late)})"
    copies = sum(len(c) for c in seen.values()) - len(seen)
    assert copies == 0, f"{copies} messages stored twice (a kill keeps the page cache)"
    print(f"sigkill: p99 {p99(late)} ms, max {max(late)} ms, outage {up_at - down_at:.0f} ms")


def test_automatic_failover_delivers_the_old_masters_delayed_messages_on_time(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, QUEUES)
    schedule = Schedule()
    with tidemq.Producer(ns.address) as producer:
        schedule.send(producer, TOPIC, delays(2))
        later = producer.send(TOPIC, b"recall-me", delay=120)
    first = group.master()
    group.wait_isr({1, 2, 3})
    sleep_until_fault(schedule)
    down_at = time.time() * 1000
    group.kill(first)
    second = group.master(not_id=first)
    up_at = time.time() * 1000
    # The handle names the group, not a broker: the new master recalls the old master's timer.
    with tidemq.Producer(ns.address) as producer:
        assert producer.recall(TOPIC, later.recall_handle) == later.msg_id
        with pytest.raises(tidemq.errors.DelayedMessageNotFound):
            producer.recall(TOPIC, later.recall_handle)
    wait_delivered(lambda: group.brokers[group.master()], schedule.due, SPREAD_S + 20)
    # Most of the schedule fell due after the first master died: the new master fired it.
    assert sum(at > up_at for at in schedule.due.values()) > COUNT // 3
    seen = stored(group.brokers[second], TOPIC, QUEUES)
    problems, late, after = lateness_report(schedule.due, seen, (down_at, up_at))
    assert not problems, problems[:10]
    assert not after, after[:10]
    assert p99(late) <= 1_000, f"p99 lateness {p99(late)} ms (max {max(late)})"
    # At least once: a replication chunk cut between delivered messages and their Fired mark
    # has the new master deliver them again. Each copy is still no earlier than due.
    copies = sum(len(c) for c in seen.values()) - len(seen)
    print(f"failover: {copies} copies, p99 {p99(late)} ms, outage {up_at - down_at:.0f} ms")
