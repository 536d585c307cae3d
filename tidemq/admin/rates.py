"""Produce and consume rates from two samples of the brokers' offset tables (``GetOffsetTable``):
the arithmetic that ``tidemq cluster status`` and the console's history share. Pure: no I/O, no
clock; the caller says how many seconds lie between the samples.

- produced: the growth of a queue's max offset;
- consumed: the growth of a group's position on a queue.

A queue or position present in only one of the samples (a topic created or deleted, a broker
group gone) counts as nothing rather than a jump; a position that moved back (an offset reset)
counts as no consumption. System topics (``%SYS%``) are not produced by users and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidemq.admin.offset_tables import GroupPosition, OffsetTable

SYSTEM_PREFIX = "%SYS%"

QueueKey = tuple[str, str, int]  # broker group, topic, queue id
PositionKey = tuple[str, str, str, int]  # broker group, consumer group, topic, queue id


@dataclass(frozen=True)
class Sample:
    """One reading of every broker group's table, flattened."""

    max_offsets: dict[QueueKey, int]
    min_offsets: dict[QueueKey, int]
    positions: dict[PositionKey, GroupPosition]

    @classmethod
    def of(cls, tables: Iterable[OffsetTable]) -> Sample:
        max_offsets: dict[QueueKey, int] = {}
        min_offsets: dict[QueueKey, int] = {}
        positions: dict[PositionKey, GroupPosition] = {}
        for t in tables:
            for (topic, q), offs in t.queues.items():
                max_offsets[t.broker, topic, q] = offs.max_offset
                min_offsets[t.broker, topic, q] = offs.min_offset
            for p in t.positions:
                positions[t.broker, p.group, p.topic, p.queue_id] = p
        return cls(max_offsets, min_offsets, positions)


@dataclass
class Growth:
    """Messages produced and consumed between two samples."""

    produced_by_topic: dict[str, int] = field(default_factory=dict)
    produced_by_broker: dict[str, int] = field(default_factory=dict)
    consumed_by_group_topic: dict[tuple[str, str], int] = field(default_factory=dict)
    consumed_by_broker: dict[str, int] = field(default_factory=dict)


def growth(
    before_max: Mapping[QueueKey, int],
    after_max: Mapping[QueueKey, int],
    before_pos: Mapping[PositionKey, GroupPosition],
    after_pos: Mapping[PositionKey, GroupPosition],
) -> Growth:
    g = Growth()
    for (broker, topic, q), end in after_max.items():
        if topic.startswith(SYSTEM_PREFIX):
            continue
        before = before_max.get((broker, topic, q))
        n = max(end - before, 0) if before is not None else 0
        g.produced_by_topic[topic] = g.produced_by_topic.get(topic, 0) + n
        g.produced_by_broker[broker] = g.produced_by_broker.get(broker, 0) + n
    for key, p in after_pos.items():
        prev = before_pos.get(key)
        moved = max(p.offset - prev.offset, 0) if prev is not None else 0
        gt = (p.group, p.topic)
        g.consumed_by_group_topic[gt] = g.consumed_by_group_topic.get(gt, 0) + moved
        g.consumed_by_broker[key[0]] = g.consumed_by_broker.get(key[0], 0) + moved
    return g


@dataclass(frozen=True)
class BrokerRate:
    broker: str
    in_per_s: float  # messages stored per second
    out_per_s: float  # messages consumed per second (all groups)
    seconds: float  # the interval measured, by the broker's own clock


def broker_rates(first: Iterable[OffsetTable], second: Iterable[OffsetTable]) -> list[BrokerRate]:
    """Per broker group answering both times: messages in and out per second, over the time its
    own clock (``now_ms``) says lay between its two answers, so a slow call does not skew it."""
    before = {t.broker: t for t in first}
    out = []
    for after in sorted(second, key=lambda t: t.broker):
        prev = before.get(after.broker)
        if prev is None or after.now_ms <= prev.now_ms:
            continue
        a, b = Sample.of([prev]), Sample.of([after])
        g = growth(a.max_offsets, b.max_offsets, a.positions, b.positions)
        seconds = (after.now_ms - prev.now_ms) / 1000
        out.append(
            BrokerRate(
                after.broker,
                g.produced_by_broker.get(after.broker, 0) / seconds,
                g.consumed_by_broker.get(after.broker, 0) / seconds,
                seconds,
            )
        )
    return out
