"""Producers' check streams (WatchTransactionChecks), by producer group: the checker hands each
check to one of the group's connected producers, round robin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

# Checks queued for one stream beyond this are dropped: the half is checked again next interval.
MAX_QUEUED = 1024
# How often an idle stream looks whether its broker is still the master.
ROLE_CHECK_S = 1.0


class CheckStreams:
    def __init__(self) -> None:
        self._groups: dict[str, list[asyncio.Queue[Any]]] = {}
        self._turn: dict[str, int] = {}

    def connected(self, group: str) -> int:
        return len(self._groups.get(group, ()))

    def push(self, group: str, check: Any) -> bool:
        """Give ``check`` to the group's next producer; False when none is connected."""
        queues = self._groups.get(group)
        if not queues:
            return False
        turn = self._turn.get(group, 0)
        self._turn[group] = turn + 1
        q = queues[turn % len(queues)]
        if q.qsize() >= MAX_QUEUED:
            return False
        q.put_nowait(check)
        return True

    async def stream(
        self, group: str, stop: asyncio.Event, is_master: Callable[[], bool]
    ) -> AsyncIterator[Any]:
        """The checks for one producer, until ``stop`` is set, the stream is cancelled, or this
        broker is no longer the master (only a master checks: the producer opens its stream
        again, to the group's master of the moment)."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._groups.setdefault(group, []).append(q)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set() and is_master():
                getting = asyncio.ensure_future(q.get())
                done, _ = await asyncio.wait(
                    {getting, stopping}, timeout=ROLE_CHECK_S, return_when=asyncio.FIRST_COMPLETED
                )
                if getting not in done:
                    getting.cancel()
                    continue
                yield getting.result()
        finally:
            stopping.cancel()
            queues = self._groups.get(group, [])
            if q in queues:
                queues.remove(q)
            if not queues:
                self._groups.pop(group, None)
