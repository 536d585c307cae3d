"""What the console remembers between page views: the last hour of rates and lag, per topic, per
consumer group and per slave, computed from the brokers' own figures at each sample.

The rate arithmetic is ``tidemq.admin.rates`` (``tidemq cluster status`` uses it too).
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
from tidemq.admin.rates import PositionKey, QueueKey, Sample, growth

HOUR_MS = 3_600_000
DLQ_PREFIX = "%DLQ%"


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
        sample = Sample.of(tables)
        new_max, new_min, new_pos = sample.max_offsets, sample.min_offsets, sample.positions
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
        g = growth(self._max, new_max, self._pos, new_pos)
        for topic, n in g.produced_by_topic.items():
            self._series(self.produce_rate, topic).add(at_ms, n / elapsed_s)
        for broker, n in g.produced_by_broker.items():
            self._series(self.broker_produce_rate, broker).add(at_ms, n / elapsed_s)
        for gt, n in g.consumed_by_group_topic.items():
            self._series(self.consume_rate, gt).add(at_ms, n / elapsed_s)
        for broker, n in g.consumed_by_broker.items():
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
