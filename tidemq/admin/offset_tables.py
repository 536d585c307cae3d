"""Every queue's offsets and every group's position, one call per broker group: what the console
samples at each interval (``GetOffsetTable``) instead of a call per topic and group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemq.errors import TidemqError
from tidemq.protos import broker_pb2

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    _Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """A pull group's committed offset, or a receive group's done offset (``receive``) with its
    in-flight and retrying messages."""

    group: str
    topic: str
    queue_id: int
    offset: int
    receive: bool = False
    inflight: int = 0
    retrying: int = 0


@dataclass(frozen=True)
class OffsetTable:
    broker: str  # the broker group
    now_ms: int  # the broker's clock when it read the table
    queues: dict[tuple[str, int], QueueOffsets]
    positions: list[GroupPosition]

    @classmethod
    def from_proto(cls, broker: str, r: Any) -> OffsetTable:
        return cls(
            broker,
            int(r.now_ms),
            {(q.topic, q.queue_id): QueueOffsets(q.min_offset, q.max_offset) for q in r.queues},
            [
                GroupPosition(
                    p.group, p.topic, p.queue_id, p.offset, p.receive, p.inflight, p.retrying
                )
                for p in r.positions
            ],
        )


class AsyncOffsetTables:
    if TYPE_CHECKING:
        _call: _Call

        async def masters(self, cluster: str | None = None) -> dict[str, str]: ...

    async def offset_tables(self) -> tuple[list[OffsetTable], dict[str, str]]:
        """Each broker group's table from its master, and the groups that did not answer
        (broker group -> why), so one unreachable broker leaves the others' figures standing."""
        tables: list[OffsetTable] = []
        failed: dict[str, str] = {}
        for name, address in sorted((await self.masters()).items()):
            try:
                r = await self._call(address, "GetOffsetTable", broker_pb2.GetOffsetTableRequest())
            except TidemqError as e:
                failed[name] = str(e)
                continue
            tables.append(OffsetTable.from_proto(name, r))
        return tables, failed
