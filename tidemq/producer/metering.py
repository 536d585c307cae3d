"""What the sender tells ``tidemq.metrics`` about a request: its messages' outcomes, their
latency and the retries, one increment per topic and request (a record block's thousand
messages are one ``inc``). Called only when the producer has metrics."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidemq.metrics import SEND_OUTCOMES, ClientMetrics
from tidemq.types import send_status

if TYPE_CHECKING:
    from tidemq.producer.blocks import Block
    from tidemq.producer.pending import Pending


def record_retry(metrics: ClientMetrics, items: Sequence[Pending | Block]) -> None:
    counts: Tally[str] = Tally()
    for p in items:
        counts[p.topic] += p.count
    for topic, n in counts.items():
        metrics.retried(topic, n)


def record_answer(
    metrics: ClientMetrics,
    blocks: Sequence[Block],
    messages: Sequence[Pending],
    resp: Any,
    send_timeout_s: float,
) -> None:
    """A successful SendMessage answer: blocks share one status, messages have one each."""
    counts: Tally[tuple[str, str]] = Tally()
    if blocks:
        outcome = SEND_OUTCOMES[send_status(resp.block_status)]
        for b in blocks:
            counts[b.topic, outcome] += b.count
    for p, r in zip(messages, resp.results, strict=True):
        counts[p.topic, SEND_OUTCOMES[send_status(r.status)]] += 1
    for (topic, outcome), n in counts.items():
        metrics.sent(topic, outcome, n)
    # Every deadline is its message's acceptance plus the send timeout: the earliest one is
    # the oldest message's, whose wait is the longest the request answers.
    earliest: dict[str, float] = {}
    items: list[Block | Pending] = [*blocks, *messages]
    for item in items:
        seen = earliest.get(item.topic)
        if seen is None or item.deadline < seen:
            earliest[item.topic] = item.deadline
    now = time.monotonic()
    for topic, deadline in earliest.items():
        metrics.sent_latency(topic, max(0.0, now - (deadline - send_timeout_s)))
