"""The Admin client's consumer-group values as the CLI shows them: JSON-friendly dicts, the same
for ``--json`` and for the tables, so both always say the same thing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidemq.admin import Admin, QueueStatus


def group_json(g: Any) -> dict[str, Any]:
    """One consumer group's settings (``Admin.get_consumer_group``'s value)."""
    policy = g.retry_policy
    return {
        "group": g.group,
        "model": g.model,
        "mode": g.mode,
        "topics": sorted(g.topics),
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


def receive_rows(state: Any) -> tuple[list[dict[str, Any]], int]:
    """Per queue figures of a receive group (``Admin.receive_state``) and its dead letters."""
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
            "held": q.held,
            "lag": max(0, q.max_offset - q.done_offset),
        }
        for q in state.queues
    ]
    rows.sort(key=lambda r: (r["topic"], r["broker"], r["queue_id"]))
    return rows, int(state.dead_letters)


def offsets_rows(by_topic: Mapping[str, Sequence[QueueStatus]]) -> list[dict[str, Any]]:
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


def call_update(admin: Admin, group: str, changes: Mapping[str, Any]) -> Any:
    """``Admin.update_consumer_group`` with what ``consumer-group update``'s flags asked for."""
    kwargs = dict(changes)
    return admin.update_consumer_group(group, **kwargs)
