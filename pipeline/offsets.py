"""Queue positions of a query: what users write in ``startingOffsets`` / ``endingOffsets``, and
what the streaming source keeps in Spark's checkpoint. Pure functions, no broker calls.

Checkpointed offsets name every queue by topic, broker group and queue id, each the next offset
to read::

    {"orders": {"broker-a": {"0": 23, "1": 40}, "broker-b": {"0": 7}}}

Users may write the same, or, for a topic served by one broker group, leave the group out:
``{"orders": {"0": 23, "1": -2}}``. -2 means the queue's earliest offset, -1 its latest; the
words ``earliest`` / ``latest`` mean that for every queue.

Spark compares offsets as JSON text, so every dict built here is in one canonical order
(topics, groups by name; queues by number): the same positions always print the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tidemq.routes import MessageQueue

EARLIEST: Final = -2
LATEST: Final = -1

# topic -> broker group -> queue id (a str, as JSON keeps it) -> offset
Offsets = dict[str, dict[str, dict[str, int]]]


class OffsetSpecError(ValueError):
    """startingOffsets / endingOffsets that cannot apply to the topics' queues."""


@dataclass(frozen=True)
class QueueBounds:
    """A queue's valid range when it was looked at: [min_offset, max_offset)."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed startingOffsets / endingOffsets: a default for unlisted queues, and per-topic
    entries keyed by (group or None, queue id)."""

    default: int  # EARLIEST or LATEST
    topics: Mapping[str, Mapping[tuple[str | None, int], int]]


def parse_spec(text: str | None, default: int, *, name: str) -> OffsetSpec:
    """``earliest``, ``latest`` or per-queue JSON; ``default`` when ``text`` is None."""
    if text is None or not text.strip():
        return OffsetSpec(default, {})
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec(EARLIEST if word == "earliest" else LATEST, {})
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise OffsetSpecError(f"{name} is neither earliest/latest nor JSON: {e}") from None
    if not isinstance(raw, dict):
        raise OffsetSpecError(f"{name} JSON must be an object of topics")
    topics: dict[str, dict[tuple[str | None, int], int]] = {}
    for topic, queues in raw.items():
        if not isinstance(queues, dict):
            raise OffsetSpecError(f"{name}: {topic!r} must map queue ids (or groups) to offsets")
        entries: dict[tuple[str | None, int], int] = {}
        for k, v in queues.items():
            if isinstance(v, dict):
                for qid, off in v.items():
                    entries[k, _queue_id(qid, name)] = _offset(off, name)
            else:
                entries[None, _queue_id(k, name)] = _offset(v, name)
        topics[topic] = entries
    return OffsetSpec(default, topics)


def _queue_id(raw: str, name: str) -> int:
    try:
        qid = int(raw)
    except ValueError:
        raise OffsetSpecError(f"{name}: queue id {raw!r} is not a number") from None
    if qid < 0:
        raise OffsetSpecError(f"{name}: queue id {qid} is negative")
    return qid


def _offset(raw: Any, name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < EARLIEST:
        raise OffsetSpecError(f"{name}: offset {raw!r} must be -2, -1 or >= 0")
    return int(raw)


def resolve(
    spec: OffsetSpec, queues: Mapping[MessageQueue, QueueBounds], *, name: str, ending: bool
) -> dict[MessageQueue, int]:
    """Concrete offsets for every queue in ``queues``, checked against each queue's range.

    A starting offset below the queue's minimum is kept (the read reports the data loss); one
    past its end, or an ending offset outside the range, is an error. -2 is not an end."""
    by_topic_groups: dict[str, set[str]] = {}
    for q in queues:
        by_topic_groups.setdefault(q.topic, set()).add(q.broker_name)
    explicit: dict[MessageQueue, int] = {}
    for topic, entries in spec.topics.items():
        groups = by_topic_groups.get(topic)
        if groups is None:
            raise OffsetSpecError(f"{name} names topic {topic!r}, which is not being read")
        for (named, qid), off in entries.items():
            if named is None and len(groups) != 1:
                raise OffsetSpecError(
                    f"{name}: topic {topic!r} is served by broker groups {sorted(groups)}; "
                    f'name the group: {{"{topic}": {{"<group>": {{"{qid}": {off}}}}}}}'
                )
            key = MessageQueue(topic, named if named is not None else next(iter(groups)), qid)
            if key not in queues:
                raise OffsetSpecError(f"{name} names queue {key}, which the topic does not have")
            explicit[key] = off
    out: dict[MessageQueue, int] = {}
    for key, bounds in queues.items():
        off = explicit.get(key, spec.default)
        if off == EARLIEST:
            if ending:
                raise OffsetSpecError(f"{name}: -2 (earliest) is not a valid end ({key})")
            off = bounds.min_offset
        elif off == LATEST:
            off = bounds.max_offset
        elif off > bounds.max_offset:
            raise OffsetSpecError(
                f"{name}: offset {off} of {key} is past the queue's end {bounds.max_offset}"
            )
        elif ending and off < bounds.min_offset:
            raise OffsetSpecError(
                f"{name}: offset {off} of {key} is below the queue's start {bounds.min_offset}"
            )
        out[key] = off
    return out


def to_json_dict(offsets: Mapping[MessageQueue, int]) -> Offsets:
    """The canonical checkpoint form (see the module docstring)."""
    out: Offsets = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {}).setdefault(key.broker_name, {})[str(key.queue_id)] = offsets[
            key
        ]
    return out


def from_json_dict(raw: Mapping[str, Any]) -> dict[MessageQueue, int]:
    return {
        MessageQueue(topic, broker, int(qid)): int(off)
        for topic, groups in raw.items()
        for broker, queues in groups.items()
        for qid, off in queues.items()
    }


def limit_rows(
    start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int], max_rows: int
) -> dict[MessageQueue, int]:
    """End offsets taking at most ``max_rows`` messages in all, spread over the queues in
    proportion to their backlog (Spark's Kafka source does the same with partitions).

    Shares are rounded down and the rows left over go to the queues with the largest
    remainders, so the total is exactly ``min(max_rows, backlog)`` and every queue with a
    backlog progresses once its share reaches one message."""
    backlog = {k: max(0, latest[k] - start.get(k, 0)) for k in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    take = {k: n * max_rows // total for k, n in backlog.items()}
    left = max_rows - sum(take.values())
    by_remainder = sorted(backlog, key=lambda k: (-(backlog[k] * max_rows % total), k))
    for k in by_remainder[:left]:
        take[k] += 1
    return {k: start.get(k, 0) + take[k] for k in latest}
