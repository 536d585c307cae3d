"""SIGKILL of the broker under receive/ack load, then a restart on the same store: the group's
in-flight state comes back from the CommitLog. Every answer the members got (a delivery, an
ack) stood for records in the CommitLog: on disk under SYNC flush, in the page cache (which a
process kill does not lose) under ASYNC flush, the default. So after the restart, in both modes:

- every SEND_OK message is acked at least once (none lost);
- no acked message is delivered again;
- what a member held at the kill is delivered again only after its invisible time, with its
  attempt incremented (the delivery itself survived the kill).
"""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_checks import (
    SLACK_MS,
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    next_delivery,
    overlaps,
)
from tests.integration.receive_cluster import Senders, SendLog, create_topic, port_of, routed_broker
from tests.integration.receivers import (
    Delivery,
    DeliveryLog,
    members,
    record_delivery,
    simple_consumer,
    wait_all_done,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
GROUP = "billing"
HOLD_S = 3.0
KEYS = [f"k{i}" for i in range(8)]


@pytest.mark.parametrize("flush", ["SYNC", "ASYNC"])
def test_sigkill_under_receive_load_loses_no_ack_and_redelivers_what_was_in_flight(
    nameserver: NameServerProcess, start_broker: StartBroker, flush: str
) -> None:
    broker = routed_broker(start_broker, nameserver, "--flush", flush)
    create_topic(nameserver, TOPIC, queues=4)
    log, sent = DeliveryLog(), SendLog()
    group = members(3, nameserver.address, GROUP, TOPIC, log, invisible_s=1.0, batch=8)
    senders = Senders(nameserver.address, TOPIC, [KEYS[:4], KEYS[4:]], 40, sent, interval_s=0.05)
    with group, senders, simple_consumer(nameserver.address, GROUP, TOPIC) as holder:
        wait_until(lambda: group.healthy() and len(log.done_bodies()) >= 80, 30, "80 acks")
        # A member that takes messages and dies with them (it never acks): they are in flight
        # at the kill.
        held: list[Delivery] = []
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            got = holder.receive(max_messages=8, invisible_duration_s=HOLD_S, timeout_s=1)
            held = [record_delivery(log, "holder", m, round(HOLD_S * 1000)) for m in got]
        assert held, "the holder received nothing to hold"
        killed_at = time.time() * 1000
        broker.kill()
        assert (broker.store_dir / "abort").exists()  # a crash, not a clean stop
        routed_broker(start_broker, nameserver, "--flush", flush, port=port_of(broker))
        wait_until(lambda: group.healthy() and senders.finished(), 60, "the sends")
        wait_all_done(log, sent, group, 40, " after the restart")
    assert len(sent.bodies()) >= 200, sent.failed[:5]
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(duplicates(log), "acked messages delivered again")
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    assert_clean(attempt_problems(log, exact=False), "messages with wrong attempt counts")
    for h in held:
        again = next_delivery(log, h)
        assert again.granted_ms + SLACK_MS >= h.invisible_until_ms, f"{again} before {h} ended"
        assert again.attempt == h.attempt + 1, f"{again} after {h}"
    before = [d for d in log.deliveries() if d.done and (d.ended_at_ms or 0) < killed_at]
    after = [d for d in log.deliveries() if d.received_at_ms > killed_at]
    print(
        f"held at the kill {len(held)}, acked before it {len(before)}, deliveries after it"
        f" {len(after)}, member errors {len(group.errors())}, failed sends {len(sent.failed)}"
    )
