"""Receive/ack with many members at once, checked from their history: while a message is
invisible no other member gets it, every message is acked in the end, and each redelivery
counts one more attempt.

Four members of one group share a topic on a real broker: two threads of the test's process and
two processes of their own. Invisible times are 1 s (the broker's minimum); their plan drops some
messages (lets them expire), nacks others, and acks some only just before, or just after, their
invisible time ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_checks import (
    assert_clean,
    assert_every_sent_message_acked,
    attempt_problems,
    duplicates,
    overlaps,
)
from tests.integration.receive_cluster import (
    Senders,
    SendLog,
    configure_group,
    create_topic,
    routed_broker,
)
from tests.integration.receive_member import MemberProcess, args_for
from tests.integration.receivers import (
    MIXED_INVISIBLE_S,
    DeliveryLog,
    Members,
    Outcome,
    members,
    mixed_plan,
    wait_all_done,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"
GROUP = "billing"
KEYS = [f"k{i}" for i in range(8)]


@dataclass
class Everyone:
    """Member threads of this process and member processes, as one."""

    threads: Members
    processes: list[MemberProcess]
    log: DeliveryLog

    def healthy(self) -> bool:
        for p in self.processes:
            p.healthy()
            p.read_into(self.log)
        return self.threads.healthy()

    def errors(self) -> list[str]:
        return self.threads.errors()


def test_members_never_hold_a_message_at_once_and_every_message_is_acked(
    nameserver: NameServerProcess, start_broker: StartBroker, tmp_path: Path
) -> None:
    routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=4)
    # Retries 1 s after each failure (the default's second step is 5 s).
    configure_group(nameserver, GROUP, retry_delays_s=[1.0])
    log, sent = DeliveryLog(), SendLog()
    options = {"plan": "mixed", "invisible_s": MIXED_INVISIBLE_S, "batch": 4}
    threads = members(
        2,
        nameserver.address,
        GROUP,
        TOPIC,
        log,
        plan=mixed_plan,
        invisible_s=MIXED_INVISIBLE_S,
        batch=4,
    )
    processes = [
        MemberProcess(
            tmp_path / f"member-p{i}.jsonl",
            *args_for(nameserver.address, GROUP, TOPIC, f"{GROUP}-p{i}", **options),
        )
        for i in range(2)
    ]
    everyone = Everyone(threads, processes, log)
    try:
        with threads:
            with Senders(nameserver.address, TOPIC, [KEYS[:4], KEYS[4:]], 25, sent) as senders:
                wait_until(lambda: everyone.healthy() and senders.finished(), 30, "the sends")
            assert len(sent.bodies()) == 200, sent.failed[:5]
            wait_all_done(log, sent, everyone, 40)
    finally:
        for p in processes:
            p.stop(log)
    assert_every_sent_message_acked(sent.bodies(), log)
    assert_clean(overlaps(log), "deliveries while another delivery held the message")
    assert_clean(duplicates(log), "acked messages delivered again")
    assert_clean(attempt_problems(log, exact=True), "messages with wrong attempt counts")
    deliveries = log.deliveries()
    redelivered = [d for d in deliveries if d.attempt >= 2]
    # The plan's failures did happen, members of both kinds took part, and redeliveries went
    # to other members too: the history above covered what it is meant to.
    assert len(redelivered) >= 30, len(redelivered)
    assert any(d.attempt == 3 for d in deliveries)
    assert {d.member for d in deliveries} == {f"{GROUP}-{m}" for m in ("m0", "m1", "p0", "p1")}
    first_member = {d.body: d.member for d in deliveries if d.attempt == 1}
    assert any(d.member != first_member[d.body] for d in redelivered)
    print(
        f"deliveries {len(deliveries)}, redelivered {len(redelivered)}, late acks refused"
        f" {sum(d.outcome is Outcome.ACK_REFUSED for d in deliveries)}"
    )
