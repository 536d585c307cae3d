"""Receive/ack with many members at once, checked from their history: while a message is
invisible no other member gets it, every message is acked in the end, and each redelivery
counts one more attempt.

Four members of one group share a topic on a real broker, with 1 s invisible times (the broker's
minimum) and a plan that drops some messages (lets them expire), nacks others, and acks some
only just before, or just after, their invisible time ends.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_checks import (
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    overlaps,
)
from tests.integration.receivers import (
    Action,
    DeliveryLog,
    Senders,
    SendLog,
    configure_group,
    create_topic,
    members,
    routed_broker,
    wait_all_done,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
GROUP = "billing"
INVISIBLE_S = 1.0
KEYS = [f"k{i}" for i in range(8)]


def mixed_plan(message: Any) -> tuple[Action, float]:
    """Per delivery, from its body and attempt: ~12% dropped, ~12% nacked, ~6% acked at about
    the end of the invisible time (some in time, some too late), the rest acked at once; a
    few are dropped again on their second delivery."""
    attempt: int = message.delivery_attempt
    roll = zlib.crc32(message.body + b"#%d" % attempt) % 100
    if attempt == 1:
        if roll < 12:
            return Action.DROP, 0.0
        if roll < 24:
            return Action.NACK, 0.0
        if roll < 30:
            return Action.ACK, INVISIBLE_S - 0.1 + (roll % 3) * 0.1
    elif attempt == 2 and roll < 10:
        return Action.DROP, 0.0
    return Action.ACK, 0.0


def test_members_never_hold_a_message_at_once_and_every_message_is_acked(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=4)
    # Retries 1 s after each failure (the default's second step is 5 s).
    configure_group(nameserver, GROUP, retry_delays_s=[1.0])
    log, sent = DeliveryLog(), SendLog()
    group = members(
        4, nameserver.address, GROUP, TOPIC, log, plan=mixed_plan, invisible_s=INVISIBLE_S, batch=4
    )
    with group:
        with Senders(nameserver.address, TOPIC, [KEYS[:4], KEYS[4:]], 25, sent) as senders:
            wait_until(lambda: group.healthy() and senders.finished(), 30, "the sends")
        assert len(sent.bodies()) == 200, sent.failed[:5]
        wait_all_done(log, sent, group, 40)
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    assert_clean(duplicates(log), "acked messages delivered again")
    assert_clean(attempt_problems(log, exact=True), "messages with wrong attempt counts")
    deliveries = log.deliveries()
    redelivered = [d for d in deliveries if d.attempt >= 2]
    # The plan's failures did happen, and redeliveries went to other members too: the history
    # above covered what it is meant to.
    assert len(redelivered) >= 30, len(redelivered)
    assert any(d.attempt == 3 for d in deliveries)
    first_member = {d.body: d.member for d in deliveries if d.attempt == 1}
    assert any(d.member != first_member[d.body] for d in redelivered)
    print(
        f"deliveries {len(deliveries)}, redelivered {len(redelivered)}, "
        f"late acks refused {sum(d.outcome.value == 'ack-refused' for d in deliveries)}"
    )
