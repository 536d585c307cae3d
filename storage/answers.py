"""What ``MessageStore`` answers besides messages: a put's result (its durable and dispatched
futures) and the store's figures (``stats``)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from tidemq.storage.record import AppendResult, BlockPlacement
from tidemq.storage.recovery import RecoveryReport
from tidemq.storage.results import PutStatus

T = TypeVar("T")


@dataclass
class PutResult:
    """``durable``: the flush status (at once under async flush). ``dispatched``: done once the
    records are in their ConsumeQueues and the index, visible to consumers; it fails with the
    reason (``DiskFullError``, ``DiskFailedError``, ...) when dispatch cannot get there. A
    broker acknowledges a send only when both are answered well."""

    results: list[AppendResult]
    durable: Future[PutStatus]
    dispatched: Future[None] = field(default_factory=lambda: done_future(None))

    def wait(self, timeout_s: float | None = None) -> PutStatus:
        return self.durable.result(timeout_s)

    @property
    def end(self) -> int:
        """Where the put's records end in the log (its results need not be in log order: an
        idempotent send answers in the request's order what it put grouped by queue)."""
        return max(r.phy_offset + r.size for r in self.results)


@dataclass
class BlockPutResult:
    """A put of blocks: where each went (``placements``, in the put's order), the store timestamp
    and host every record carries, and the futures of ``PutResult``."""

    placements: list[BlockPlacement]
    store_timestamp_ms: int
    store_host: tuple[bytes, int]
    end: int  # the log's end after the put
    durable: Future[PutStatus]
    dispatched: Future[None] = field(default_factory=lambda: done_future(None))

    @property
    def body_bytes(self) -> int:
        """The stored messages' bodies, in bytes."""
        return sum(p.body_bytes for p in self.placements)


@dataclass
class StoreStats:
    commitlog_min_offset: int
    commitlog_max_offset: int
    flushed_offset: int
    dispatched_offset: int
    disk_usage_ratio: float
    writable: bool
    queues: int
    recovery: RecoveryReport | None = field(default=None)


def done_future(value: T) -> Future[T]:
    f: Future[T] = Future()
    f.set_result(value)
    return f
