"""A failed message comes back after the backoff of its consumer group's retry policy: the gap
between a nack and the next delivery follows the policy's delays (here a customized 1 s, 2 s,
3 s), and so does an expired invisible time shorter than the delay.

The tolerance: never early (the broker's ms truncation aside), and at most ``LATE_MS`` late, for a
noisy 2-core machine. A broker that ignored the backoff would redeliver at once; one that used
the default policy (1 s, 5 s, 10 s, ...) would be seconds late from the second retry on.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_cluster import (
    SendLog,
    configure_group,
    create_topic,
    routed_broker,
    send_all,
    wall_ms,
)
from tests.integration.receivers import simple_consumer

pytestmark = pytest.mark.integration

TOPIC = "orders"
GROUP = "retrying"
DELAYS_S = [1.0, 2.0, 3.0]
INVISIBLE_MS = 1_000
LATE_MS = 1_000
EARLY_MS = 1.0  # the broker stamps whole ms


def receive_one(consumer: Any, timeout_s: float) -> Any:
    """The next delivery, waiting up to ``timeout_s`` (long polls until then)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        got = consumer.receive(
            max_messages=1, invisible_duration_s=INVISIBLE_MS / 1000, timeout_s=min(left, 5)
        )
        if got:
            assert len(got) == 1
            return got[0]
    raise AssertionError(f"nothing delivered within {timeout_s} s")


def granted_ms(m: Any) -> int:
    return int(m.invisible_until_ms) - INVISIBLE_MS


def test_redeliveries_follow_the_groups_retry_delays_after_nacks_and_expiry(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=1)
    configure_group(nameserver, GROUP, retry_delays_s=DELAYS_S, max_delivery_attempts=8)
    send_all(nameserver.address, TOPIC, {"retry-me": 1}, SendLog())
    gaps = []
    with simple_consumer(nameserver.address, GROUP, TOPIC) as consumer:
        m = receive_one(consumer, 10)
        assert (m.body, m.delivery_attempt) == (b"retry-me:0", 1)
        for attempt, delay_s in enumerate(DELAYS_S, start=1):
            nacked_at = wall_ms()
            consumer.nack(m)
            m = receive_one(consumer, delay_s + 5)
            assert m.delivery_attempt == attempt + 1
            gap = granted_ms(m) - nacked_at
            gaps.append(round(gap))
            assert delay_s * 1000 - EARLY_MS <= gap <= delay_s * 1000 + LATE_MS, (attempt, gaps)
        # Attempt 4, left to expire after 1 s: it comes back at its lease start plus the
        # policy's delay for attempt 4 (the last one, 3 s), not when its invisible time ends.
        expired = receive_one(consumer, DELAYS_S[-1] + 5)
        assert expired.delivery_attempt == 5
        gap = granted_ms(expired) - granted_ms(m)
        gaps.append(gap)
        assert DELAYS_S[-1] * 1000 - EARLY_MS <= gap <= DELAYS_S[-1] * 1000 + LATE_MS, gaps
        consumer.ack(expired)
        # Acked: nothing comes back (an ignored ack would, 3 s after the last grant).
        assert consumer.receive(max_messages=1, invisible_duration_s=1, timeout_s=4) == []
    print(f"gaps (ms) after nacks {DELAYS_S} s and an expiry: {gaps}")
