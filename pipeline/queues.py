"""Driver-side look-ups: which queues the topics have, their offset ranges right now, and where
a point in time falls in each (the brokers' offset search)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from tidemq._runtime import LoopThread
from tidemq.admin import AsyncAdmin
from tidemq.errors import TidemqError
from tidemq.pipeline.offsets import QueueBounds
from tidemq.protos import broker_pb2
from tidemq.routes import MessageQueue


class _QueueAdmin(AsyncAdmin):
    """The admin client plus the offset search that ``consumer-group reset --to-time`` makes,
    without its commit (a query keeps its positions in Spark's checkpoint, not in a group)."""

    async def offsets_at(
        self, topic: str, timestamp_ms: int, queues: Sequence[MessageQueue]
    ) -> dict[MessageQueue, int]:
        """Per queue of ``topic``: the first offset whose message was stored at or after
        ``timestamp_ms`` (the queue's end when every message is older), asked of the broker
        that serves its reads (the master, or a slave while the group has none)."""
        route = await self.route(topic)

        async def one(mq: MessageQueue) -> tuple[MessageQueue, int]:
            group = route.groups.get(mq.broker_name)
            address = group.read_address() if group is not None else None
            if address is None:
                raise TidemqError(
                    f"broker group {mq.broker_name} of {topic!r} is not routed",
                    code="ROUTE_NOT_FOUND",
                    retriable=True,
                )
            resp = await self._call(
                address,
                "SearchOffset",
                broker_pb2.SearchOffsetRequest(
                    topic=topic, queue_id=mq.queue_id, timestamp_ms=timestamp_ms
                ),
            )
            return mq, int(resp.offset)

        return dict(await asyncio.gather(*(one(mq) for mq in queues)))


class QueueTable:
    """Queue ranges of a set of topics, asked of the brokers through one admin client.

    Created lazily by the readers (never pickled: Spark ships readers to other processes)."""

    def __init__(self, nameserver: str, topics: Sequence[str]) -> None:
        self.topics = tuple(topics)
        self._runner = LoopThread("tidemq-pipeline-queues")
        self._admin = _QueueAdmin(nameserver)

    def bounds(self) -> dict[MessageQueue, QueueBounds]:
        out: dict[MessageQueue, QueueBounds] = {}
        for topic in self.topics:
            try:
                statuses = self._runner.run(self._admin.queue_status(topic))
            except TidemqError as e:
                raise _about(topic, "cannot read the queues of", e) from e
            for s in statuses:
                out[MessageQueue(topic, s.broker, s.queue_id)] = QueueBounds(
                    s.min_offset, s.max_offset
                )
        return dict(sorted(out.items()))

    def offsets_at(
        self, timestamp_ms: int, bounds: Mapping[MessageQueue, QueueBounds]
    ) -> dict[MessageQueue, int]:
        """For every queue of ``bounds``: the first offset stored at or after
        ``timestamp_ms``, kept within the queue's range as ``bounds`` saw it (a message that
        arrived since is not part of the query)."""
        out: dict[MessageQueue, int] = {}
        for topic in self.topics:
            queues = [mq for mq in bounds if mq.topic == topic]
            try:
                found = self._runner.run(self._admin.offsets_at(topic, timestamp_ms, queues))
            except TidemqError as e:
                raise _about(topic, f"cannot search the offsets at {timestamp_ms} ms of", e) from e
            for mq, offset in found.items():
                b = bounds[mq]
                out[mq] = min(max(offset, b.min_offset), b.max_offset)
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._runner.finish(self._admin.close)


def _about(topic: str, what: str, e: TidemqError) -> TidemqError:
    return TidemqError(f"{what} topic {topic!r}: {e.args[0]}", code=e.code, retriable=e.retriable)
