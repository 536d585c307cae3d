"""The Admin client's consumer-group values as the CLI shows them: JSON-friendly dicts, the same
for ``--json`` and for the tables, so both always say the same thing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidemq.admin import ConsumerGroup, QueueStatus, ReceiveState


def group_json(g: ConsumerGroup) -> dict[str, Any]:
    """One consumer group's settings; ``model`` is None while no member has used it."""
    policy = g.retry_policy
    return {
        "group": g.group,
        "model": g.model or None,
        "mode": g.mode or None,
        "topics": sorted(g.topics),
        "brokers": list(g.brokers),
        "created_ms": g.created_ms,
        "max_delivery_attempts": g.max_delivery_attempts,
        "retry_policy": {
            "delays_ms": list(policy.delays_ms),
            "initial_ms": policy.initial_ms,
            "max_ms": policy.max_ms,
            "multiplier": policy.multiplier,
        },
        "fifo": g.fifo,
        "consume_enabled": g.consume_enabled,
    }


def receive_rows(state: ReceiveState) -> list[dict[str, Any]]:
    """Per queue figures of a receive group, by topic, broker group and queue."""
    rows = [
        {
            "topic": q.topic,
            "broker": q.broker,
            "queue_id": q.queue_id,
            "done_offset": q.done_offset,
            "next_offset": q.next_offset,
            "max_offset": q.max_offset,
            "inflight": q.inflight,
            "retrying": q.retrying,
            "blocked": q.blocked,
            "lag": q.lag,
        }
        for q in state.queues
    ]
    rows.sort(key=lambda r: (r["topic"], r["broker"], r["queue_id"]))
    return rows


def offsets_rows(by_topic: Mapping[str, Sequence[QueueStatus]]) -> list[dict[str, Any]]:
    """Per queue committed offsets of an offsets group."""
    return [
        {
            "topic": topic,
            "broker": q.broker,
            "queue_id": q.queue_id,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
            "committed_offset": q.committed_offset,
            "lag": q.lag,
        }
        for topic, queues in sorted(by_topic.items())
        for q in queues
    ]
