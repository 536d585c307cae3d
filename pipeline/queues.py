"""Driver-side look-ups: which queues the topics have and their offset ranges right now."""

from __future__ import annotations

from collections.abc import Sequence

from tidemq.admin import Admin
from tidemq.errors import TidemqError
from tidemq.pipeline.offsets import QueueBounds
from tidemq.routes import MessageQueue


class QueueTable:
    """Queue ranges of a set of topics, asked of the brokers through one ``Admin``.

    Created lazily by the readers (never pickled: Spark ships readers to other processes)."""

    def __init__(self, nameserver: str, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self._admin = Admin(nameserver)

    def bounds(self) -> dict[MessageQueue, QueueBounds]:
        out: dict[MessageQueue, QueueBounds] = {}
        for topic in self.topics:
            try:
                statuses = self._admin.queue_status(topic)
            except TidemqError as e:
                raise TidemqError(
                    f"cannot read the queues of topic {topic!r}: {e.args[0]}",
                    code=e.code,
                    retriable=e.retriable,
                ) from e
            for s in statuses:
                out[MessageQueue(topic, s.broker, s.queue_id)] = QueueBounds(
                    s.min_offset, s.max_offset
                )
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._admin.close()
