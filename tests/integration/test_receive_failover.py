"""Automatic failover (a real ZooKeeper, three brokers electing their master) under receive/ack
load. Two consumer groups read the same topic at once: ``plain`` and ``ordered`` (FIFO message
groups). The master is SIGKILLed mid-load; a slave takes over and the members follow it.

Under SYNC_MASTER every answer a member got (a delivery, an ack) was on a slave when it was
given, so: every SEND_OK message is acked by each group, none is lost, no acked message is
delivered again (the window of duplicates is zero), what a member held at the failover comes
back after its invisible time with its attempt counted, and each message group's order holds.
(ASYNC_MASTER, where the window is not zero: test_receive_failover_async.py.)
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import StartNameServer
from tests.integration.failover import Group, group_fixture  # noqa: F401 - the group fixture
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
from tests.integration.receive_cluster import configure_group
from tests.integration.receive_load import QUEUES, TOPIC, knows_fifo, receive_through_failover
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_failover_under_receive_load_loses_no_message_and_delivers_no_acked_one_again(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, QUEUES, "--config-sync-interval-ms", "500")
    configure_group(ns, "plain", retry_delays_s=[1.0])
    configure_group(ns, "ordered", retry_delays_s=[1.0], fifo=True)
    # A slave that became master without knowing "ordered" is FIFO would break its order.
    wait_until(lambda: knows_fifo(group, "ordered"), 20, "every broker to know the FIFO group")
    run = receive_through_failover(group, ns, ["plain", "ordered"], lambda r: r.sent.bodies())
    figures = []
    for name, log in run.logs.items():
        assert_every_sent_message_acked(run.sent.bodies(), log)
        dups = duplicates(log)
        figures.append(run.figures(name, len(dups)))
        assert_clean(dups, f"acked messages of {name} delivered again")
        assert_clean(overlaps(log), f"{name} deliveries while another one held the message")
        assert_clean(attempt_problems(log, exact=False), f"{name} attempt counts wrong")
        for h in run.held[name]:
            again = next_delivery(log, h)
            assert again.attempt == h.attempt + 1, f"{again} after {h}"
            assert again.granted_ms + SLACK_MS >= h.invisible_until_ms, f"{again} before {h}"
    assert run.held["plain"], "the holder got nothing to hold"
    assert_clean(
        fifo_violations(run.logs["ordered"]),
        "messages delivered before the one in front was acked",
    )
    print(
        f"failover took {run.failed_over_at - run.killed_at:.0f} ms; sent"
        f" {len(run.sent.bodies())}, not SEND_OK {len(run.sent.failed)}; " + "; ".join(figures)
    )
