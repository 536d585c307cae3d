"""Long polling: a pull at the head of a queue waits until dispatch makes messages readable.

The store's dispatch thread calls ``notify`` (any thread); waiters live on the event loop. A
waiter registers *before* it looks at the store, so a message dispatched between the look and
the wait still wakes it.
"""

from __future__ import annotations

import asyncio


class PullWaiters:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[tuple[str, int], asyncio.Event] = {}

    def register(self, topic: str, queue_id: int) -> asyncio.Event:
        ev = self._events.get((topic, queue_id))
        if ev is None:
            ev = self._events[topic, queue_id] = asyncio.Event()
        return ev

    def notify(self, topic: str, queue_id: int, _max_offset: int) -> None:
        """Called from the dispatch thread.

        Waking the loop costs a syscall, so queues nobody waits on are skipped. The unlocked
        look is safe: a waiter registers before it reads the store, and dispatch looks here
        only after the queue entry is written, so one of the two sees the other.
        """
        if (topic, queue_id) in self._events:
            self._loop.call_soon_threadsafe(self._wake, topic, queue_id)

    def _wake(self, topic: str, queue_id: int) -> None:
        ev = self._events.pop((topic, queue_id), None)
        if ev is not None:
            ev.set()

    def wake_all(self) -> None:
        """Shutdown: every waiter returns now."""
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()
