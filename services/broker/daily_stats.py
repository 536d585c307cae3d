"""Messages in and out per topic per day (RocketMQ's broker keeps the same "statsDay"), kept for
the last ``days`` days in ``{store}/config/dailyStats.json`` and shown by
``tidemq cluster status --daily``.

Counted from the broker's own offsets, as the console's rates are: a sample reads every queue's
max offset and every consumer group's committed position; what grew since the previous sample is
added to the day (UTC) of the new sample.

- in: the growth of a topic's queues' max offsets (messages stored);
- out: the growth of every group's position on the topic, summed over groups (messages
  consumed: two groups reading a message count it twice, as RocketMQ's out figure does).

The first sample, taken as the broker starts serving, is the baseline. After it, a queue
absent from the previous sample is new and counts from 0; a group's position absent from it
counts nothing that interval (a new group may start anywhere in the queue); a position that
moved back (an offset reset) counts no consumption. The samples are taken every minute and at
each read, so what was sent in the minute before a restart may be left out; what grows across
midnight counts for the later day.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.topics import TopicManager
from tidemq.storage import MessageStore, state_file
from tidemq.storage.atomic_file import write_json_atomic

log = logging.getLogger(__name__)

FILE_NAME = "dailyStats.json"
SYSTEM_PREFIX = "%SYS%"  # the broker's own topics: not user traffic

QueueKey = tuple[str, int]  # topic, queue id
PositionKey = tuple[str, str, int]  # group, topic, queue id


@dataclass(frozen=True)
class DailyFile:
    """The shape of dailyStats.json: day -> topic -> [in, out]."""

    days: dict[str, dict[str, list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class DayTopic:
    day: str
    topic: str
    messages_in: int
    messages_out: int


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


class DailyStats:
    def __init__(self, store_dir: str, days: int) -> None:
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self.keep_days = days
        self._lock = threading.Lock()
        stored = state_file.load(
            self.path,
            DailyFile,
            f"delete {self.path} (the daily statistics start again; nothing else depends on it)",
        )
        self.days: dict[str, dict[str, list[int]]] = (
            {d: {t: list(v) for t, v in topics.items()} for d, topics in stored.days.items()}
            if stored is not None
            else {}
        )
        self._max: dict[QueueKey, int] | None = None
        self._pos: dict[PositionKey, int] = {}
        self._dirty = False

    def record(
        self, now_ms: int, max_offsets: dict[QueueKey, int], positions: dict[PositionKey, int]
    ) -> None:
        """One sample; the growth since the previous one goes to ``now_ms``'s day."""
        with self._lock:
            if self._max is not None:
                day = self.days.setdefault(day_of(now_ms), {})
                for (topic, q), end in max_offsets.items():
                    before = self._max.get((topic, q), 0)
                    if topic.startswith(SYSTEM_PREFIX) or end <= before:
                        continue
                    day.setdefault(topic, [0, 0])[0] += end - before
                    self._dirty = True
                for key, offset in positions.items():
                    was = self._pos.get(key)
                    if was is None or offset <= was:
                        continue
                    day.setdefault(key[1], [0, 0])[1] += offset - was
                    self._dirty = True
                if not day:
                    del self.days[day_of(now_ms)]
                self._prune()
            self._max, self._pos = dict(max_offsets), dict(positions)

    def _prune(self) -> None:
        for d in sorted(self.days)[: -self.keep_days]:
            del self.days[d]
            self._dirty = True

    def rows(self, days: int) -> list[DayTopic]:
        """The last ``days`` days that have traffic, newest first, topics by name."""
        with self._lock:
            recent = sorted(self.days, reverse=True)[:days]
            return [
                DayTopic(d, t, v[0], v[1]) for d in recent for t, v in sorted(self.days[d].items())
            ]

    def persist(self) -> bool:
        with self._lock:
            if not self._dirty:
                return False
            snapshot = {
                d: {t: list(v) for t, v in topics.items()} for d, topics in self.days.items()
            }
            self._dirty = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(self.path, {"days": snapshot})
        return True


def take_sample(
    stats: DailyStats,
    now_ms: int,
    topics: TopicManager,
    store: MessageStore,
    offsets: OffsetManager,
) -> None:
    """Read the broker's offsets (as GetOffsetTable does) into ``stats``."""
    max_offsets = {
        (t.topic, q): store.max_offset(t.topic, q)
        for t in topics.all()
        for q in range(t.read_queue_nums)
    }
    positions = {(c.group, c.topic, c.queue_id): c.offset for c in offsets.entries()}
    stats.record(now_ms, max_offsets, positions)
