"""FIFO message groups over real brokers: within a message group, a message is delivered only
after the one in front of it (in its queue) was acked, under nacks, expired invisible times and
a SIGKILL restart; and a stuck group holds back only itself, not the other groups of its queue.
(The order across an automatic failover: test_receive_failover.py.)
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_checks import (
    SLACK_MS,
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    fifo_violations,
    next_delivery,
    overlaps,
)
from tests.integration.receive_cluster import (
    SendLog,
    configure_group,
    create_topic,
    port_of,
    routed_broker,
    send_all,
    wall_ms,
)
from tests.integration.receivers import (
    Action,
    DeliveryLog,
    Outcome,
    members,
    record_delivery,
    settle,
    simple_consumer,
    wait_all_done,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
GROUP = "ledger"
GROUPS = [f"acct-{i}" for i in range(6)]


def failing_plan(message: Any) -> tuple[Action, float]:
    """About 15% dropped and 15% nacked on the first delivery, 10% dropped on the second."""
    attempt: int = message.delivery_attempt
    roll = zlib.crc32(message.body + b"#%d" % attempt) % 100
    if attempt == 1 and roll < 15:
        return Action.DROP, 0.0
    if attempt == 1 and roll < 30:
        return Action.NACK, 0.0
    if attempt == 2 and roll < 10:
        return Action.DROP, 0.0
    return Action.ACK, 0.0


def fifo_group(ns: NameServerProcess, queues: int) -> None:
    create_topic(ns, TOPIC, queues=queues)
    configure_group(ns, GROUP, fifo=True, retry_delays_s=[1.0])


def test_each_message_group_keeps_its_order_under_nacks_and_expired_invisible_times(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver)
    fifo_group(nameserver, queues=2)
    sent, log = SendLog(), DeliveryLog()
    send_all(nameserver.address, TOPIC, dict.fromkeys(GROUPS, 12), sent)
    group = members(3, nameserver.address, GROUP, TOPIC, log, plan=failing_plan, batch=8)
    with group:
        wait_all_done(log, sent, group, 45)
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(fifo_violations(log), "messages delivered before the one in front was acked")
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    assert_clean(duplicates(log), "acked messages delivered again")
    assert_clean(attempt_problems(log, exact=True), "messages with wrong attempt counts")
    outcomes = [d.outcome for d in log.deliveries()]
    assert outcomes.count(Outcome.NACKED) >= 5 and outcomes.count(Outcome.DROPPED) >= 5


def test_each_message_group_keeps_its_order_across_a_sigkill_restart(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = routed_broker(start_broker, nameserver, "--flush", "SYNC")
    fifo_group(nameserver, queues=2)
    sent, log = SendLog(), DeliveryLog()
    send_all(nameserver.address, TOPIC, dict.fromkeys(GROUPS, 15), sent)
    hold_ms = 3_000
    with simple_consumer(nameserver.address, GROUP, TOPIC) as holder:
        # Heads of message groups, held across the kill and never acked.
        got = holder.receive(max_messages=2, invisible_duration_s=hold_ms / 1000, timeout_s=5)
        held = [record_delivery(log, "holder", m, hold_ms) for m in got]
        assert held
        assert all(h.body.endswith(":0") for h in held), [str(h) for h in held]
        group = members(2, nameserver.address, GROUP, TOPIC, log, plan=failing_plan)
        with group:
            wait_until(lambda: group.healthy() and len(log.done_bodies()) >= 25, 30, "25 acks")
            broker.kill()
            routed_broker(start_broker, nameserver, "--flush", "SYNC", port=port_of(broker))
            wait_all_done(log, sent, group, 45, " after the restart")
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(fifo_violations(log), "messages delivered before the one in front was acked")
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    assert_clean(duplicates(log), "acked messages delivered again")
    assert_clean(attempt_problems(log, exact=False), "messages with wrong attempt counts")
    for h in held:
        again = next_delivery(log, h)
        assert again.attempt == h.attempt + 1, f"{again} after {h}"
        assert again.granted_ms + SLACK_MS >= h.invisible_until_ms, f"{again} before {h} ended"


def test_a_stuck_message_group_does_not_delay_another_group_of_its_queue(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver)
    fifo_group(nameserver, queues=1)  # one queue: every message group shares it
    sent, log = SendLog(), DeliveryLog()
    send_all(nameserver.address, TOPIC, {"stuck": 2}, sent)
    stuck_ms = 30_000
    with simple_consumer(nameserver.address, GROUP, TOPIC) as holder:
        got = holder.receive(max_messages=8, invisible_duration_s=stuck_ms / 1000, timeout_s=5)
        # Only the group's head: "stuck:1" waits behind it.
        assert [m.body for m in got] == [b"stuck:0"]
        head = record_delivery(log, "holder", got[0], stuck_ms)
        group = members(2, nameserver.address, GROUP, TOPIC, log)
        with group:
            send_all(nameserver.address, TOPIC, {"free": 20}, sent)
            wait_until(
                lambda: group.healthy() and {f"free:{i}" for i in range(20)} <= log.done_bodies(),
                10,
                "the free group's messages acked while the stuck group waits",
            )
            acked_at = {d.body: d.ended_at_ms or 0.0 for d in log.deliveries() if d.done}
            latencies = [acked_at[f"free:{i}"] - sent.ok[f"free:{i}"] for i in range(20)]
            assert not [d for d in log.deliveries() if d.body == "stuck:1"]
            released_at = wall_ms()
            settle(holder, log, head, got[0], Action.ACK)
            assert head.outcome is Outcome.ACKED
            wait_all_done(log, sent, group, 10, " once the stuck head was acked")
    # RocketMQ's orderly consumption would hold the whole queue for the head's 30 s.
    assert max(latencies) < 5_000, f"latencies (ms) {sorted(latencies)}"
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(fifo_violations(log), "messages delivered before the one in front was acked")
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    unblocked = next(d for d in log.deliveries() if d.body == "stuck:1")
    print(
        f"free group: max latency {max(latencies):.0f} ms, mean {sum(latencies) / 20:.0f} ms;"
        f" stuck:1 delivered {unblocked.granted_ms - released_at:.0f} ms after the head's ack"
    )
