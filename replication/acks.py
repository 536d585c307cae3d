"""Group acknowledgement of SYNC_MASTER sends, as a pure structure: waiters keyed by the
CommitLog offset their messages end at, released together when the confirmed offset passes them.

One report from a slave can acknowledge thousands of sends; the ack handler calls ``release``
once and completes every waiter at or below the new confirmed offset. Nothing here blocks or
knows about time: the transport owns the futures and their timeouts, and a waiter whose caller
gave up (timed out, cancelled) is simply released later and ignored.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class GroupAck(Generic[T]):
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = 0  # ties keep arrival order; tokens are never compared

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, end_offset: int, token: T) -> None:
        """Wait until the confirmed offset reaches ``end_offset``."""
        heapq.heappush(self._heap, (end_offset, self._seq, token))
        self._seq += 1

    def release(self, confirmed_offset: int) -> list[T]:
        """Every token whose end offset is at or below ``confirmed_offset``, oldest first."""
        out: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= confirmed_offset:
            out.append(heapq.heappop(heap)[2])
        return out

    def drain(self) -> list[T]:
        """Every token still waiting (the master is shutting down)."""
        out = [t for _, _, t in sorted(self._heap)]
        self._heap.clear()
        return out


def quorum_offset(acked: Sequence[int], quorum: int) -> int | None:
    """The highest offset at least ``quorum`` replicas hold: the ``quorum``-th largest acked
    offset (etcd raft's committed index over a majority; here over a fixed count). None when
    fewer than ``quorum`` replicas count."""
    if quorum <= 0:
        raise ValueError("quorum must be > 0")
    if len(acked) < quorum:
        return None
    return sorted(acked, reverse=True)[quorum - 1]
