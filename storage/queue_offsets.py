"""The topic queue table: (topic, queue id) -> the queue offset the next message gets.

Filled as queues are used, not at open: a queue the table does not hold yet asks ``source`` once
(its ConsumeQueue's end, which maps that queue), so a restart with many queues reads none of
them until a message for one arrives.
"""

from __future__ import annotations

from collections.abc import Callable

QueueKey = tuple[str, int]


class QueueOffsetTable(dict[QueueKey, int]):
    __slots__ = ("_source",)

    def __init__(self, source: Callable[[QueueKey], int] | None = None) -> None:
        super().__init__()
        self._source = source

    def __missing__(self, key: QueueKey) -> int:
        value = self._source(key) if self._source is not None else 0
        self[key] = value
        return value

    def get(self, key: QueueKey, default: int | None = None) -> int | None:  # type: ignore[override]
        # One call per queue per batch, not per message: the lookups that matter stay dict's.
        value = dict.get(self, key)
        return self[key] if value is None else value
