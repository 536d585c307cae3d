"""What the console remembers between page views: the last hour of rates and lag, per topic, per
consumer group and per slave, computed from the brokers' own figures at each sample.

Pure state: ``record`` takes one sample (every broker group's offset table and the slaves'
replication lag, all read at ``at_ms``) and updates the series; nothing here does I/O or reads
a clock, so the arithmetic is tested with made-up samples.

- a topic's produce rate: the growth of the sum of its queues' max offsets per second;
- a group's consume rate on a topic: the growth of the sum of its positions per second;
- a group's lag on a topic: the sum over queues of max offset - position (never below 0).

A queue that appears or disappears between samples (a topic created, a broker group gone) is
left out of that interval's rate rather than counted as a jump; a position that moves back (an
offset reset) counts as no consumption.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemq.admin.offset_tables import GroupPosition, OffsetTable

HOUR_MS = 3_600_000
SYSTEM_PREFIX = "%SYS%"
DLQ_PREFIX = "%DLQ%"

QueueKey = tuple[str, str, int]  # broker group, topic, queue id
PositionKey = tuple[str, str, str, int]  # broker group, consumer group, topic, queue id


@dataclass
class Series:
    """(time ms, value) points, the oldest dropped when they leave the window."""

    window_ms: int
    points: deque[tuple[int, float]] = field(default_factory=deque)

    def add(self, at_ms: int, value: float) -> None:
        self.points.append((at_ms, value))
        while self.points and self.points[0][0] < at_ms - self.window_ms:
            self.points.popleft()

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


@dataclass(frozen=True)
class GroupTopic:
    """A consumer group's state on one topic at the last sample."""

    group: str
    topic: str
    lag: int
    receive: bool
    inflight: int
    retrying: int
    queues: tuple[tuple[str, int, int, int], ...]  # (broker group, queue id, position, lag)


class History:
    def __init__(self, window_ms: int = HOUR_MS) -> None:
        self.window_ms = window_ms
        self.last_ms: int | None = None
        self._max: dict[QueueKey, int] = {}
        self._min: dict[QueueKey, int] = {}
        self._pos: dict[PositionKey, GroupPosition] = {}
        self.produce_rate: dict[str, Series] = {}
        self.consume_rate: dict[tuple[str, str], Series] = {}
        self.lag: dict[tuple[str, str], Series] = {}
        self.replication_lag: dict[str, Series] = {}
        self.broker_produce_rate: dict[str, Series] = {}
        self.broker_consume_rate: dict[str, Series] = {}
        self.groups: dict[tuple[str, str], GroupTopic] = {}

    def _series(self, table: dict, key: object) -> Series:  # type: ignore[type-arg]
        s = table.get(key)
        if s is None:
            s = table[key] = Series(self.window_ms)
        return s

    def record(
        self,
        at_ms: int,
        tables: Iterable[OffsetTable],
        replication_lag_bytes: dict[str, int] | None = None,
    ) -> None:
        new_max: dict[QueueKey, int] = {}
        new_min: dict[QueueKey, int] = {}
        new_pos: dict[PositionKey, GroupPosition] = {}
        for t in tables:
            for (topic, q), offs in t.queues.items():
                new_max[t.broker, topic, q] = offs.max_offset
                new_min[t.broker, topic, q] = offs.min_offset
            for p in t.positions:
                new_pos[t.broker, p.group, p.topic, p.queue_id] = p
        elapsed_s = (at_ms - self.last_ms) / 1000 if self.last_ms is not None else 0.0
        if elapsed_s > 0:
            self._rates(at_ms, elapsed_s, new_max, new_pos)
        self._lag(at_ms, new_max, new_pos)
        for slave, lag in (replication_lag_bytes or {}).items():
            self._series(self.replication_lag, slave).add(at_ms, lag)
        self._max, self._min, self._pos, self.last_ms = new_max, new_min, new_pos, at_ms

    def _rates(
        self,
        at_ms: int,
        elapsed_s: float,
        new_max: dict[QueueKey, int],
        new_pos: dict[PositionKey, GroupPosition],
    ) -> None:
        produced: dict[str, int] = {}
        per_broker: dict[str, int] = {}
        for (broker, topic, q), end in new_max.items():
            if topic.startswith(SYSTEM_PREFIX):
                continue
            before = self._max.get((broker, topic, q))
            n = max(end - before, 0) if before is not None else 0
            produced[topic] = produced.get(topic, 0) + n
            per_broker[broker] = per_broker.get(broker, 0) + n
        for topic, n in produced.items():
            self._series(self.produce_rate, topic).add(at_ms, n / elapsed_s)
        for broker, n in per_broker.items():
            self._series(self.broker_produce_rate, broker).add(at_ms, n / elapsed_s)
        consumed: dict[tuple[str, str], int] = {}
        per_broker = {}
        for key, p in new_pos.items():
            prev = self._pos.get(key)
            moved = max(p.offset - prev.offset, 0) if prev is not None else 0
            gt = (p.group, p.topic)
            consumed[gt] = consumed.get(gt, 0) + moved
            per_broker[key[0]] = per_broker.get(key[0], 0) + moved
        for gt, n in consumed.items():
            self._series(self.consume_rate, gt).add(at_ms, n / elapsed_s)
        for broker, n in per_broker.items():
            self._series(self.broker_consume_rate, broker).add(at_ms, n / elapsed_s)

    def _lag(
        self, at_ms: int, new_max: dict[QueueKey, int], new_pos: dict[PositionKey, GroupPosition]
    ) -> None:
        per: dict[tuple[str, str], list[tuple[str, int, int, int]]] = {}
        flags: dict[tuple[str, str], list[int]] = {}
        for (broker, group, topic, q), p in new_pos.items():
            end = new_max.get((broker, topic, q))
            if end is None:  # a deleted topic's offsets are history, not lag
                continue
            gt = (group, topic)
            per.setdefault(gt, []).append((broker, q, p.offset, max(end - p.offset, 0)))
            f = flags.setdefault(gt, [0, 0, 0])
            f[0] |= p.receive
            f[1] += p.inflight
            f[2] += p.retrying
        groups: dict[tuple[str, str], GroupTopic] = {}
        for gt, queues in per.items():
            total = sum(q[3] for q in queues)
            self._series(self.lag, gt).add(at_ms, total)
            f = flags[gt]
            groups[gt] = GroupTopic(
                gt[0], gt[1], total, bool(f[0]), f[1], f[2], tuple(sorted(queues))
            )
        self.groups = groups

    # ------------------------------------------------------------------ reads for the pages
    def topic_offsets(self, topic: str) -> list[tuple[str, int, int, int]]:
        """(broker group, queue id, min offset, max offset) at the last sample."""
        return sorted(
            (b, q, self._min.get((b, t, q), 0), end)
            for (b, t, q), end in self._max.items()
            if t == topic
        )

    def topic_totals(self) -> dict[str, int]:
        """topic -> messages stored (sum of max offsets) at the last sample."""
        out: dict[str, int] = {}
        for (_, topic, _), end in self._max.items():
            out[topic] = out.get(topic, 0) + end
        return out

    def dlq_sizes(self) -> dict[str, int]:
        """group -> messages in its dead-letter queue (%DLQ%<group>) at the last sample."""
        out: dict[str, int] = {}
        for (b, topic, q), end in self._max.items():
            if topic.startswith(DLQ_PREFIX):
                group = topic[len(DLQ_PREFIX) :]
                out[group] = out.get(group, 0) + end - self._min.get((b, topic, q), 0)
        return out

    def group_topics(self, group: str) -> list[GroupTopic]:
        return sorted((g for (name, _), g in self.groups.items() if name == group), key=_topic)

    def group_lag(self) -> dict[str, int]:
        """group -> lag summed over its topics at the last sample."""
        out: dict[str, int] = {}
        for (group, _), g in self.groups.items():
            out[group] = out.get(group, 0) + g.lag
        return out


def _topic(g: GroupTopic) -> str:
    return g.topic
