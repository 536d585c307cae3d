"""Long polling of receives: a receive that found nothing waits until something may have
changed for its topic: dispatch made new messages readable (any thread), or an ack, nack,
change of invisibility or dead-letter freed a FIFO message group (the event loop).

One event per topic, not per queue: a receive over every queue of a topic waits on one. A
waiter registers before it looks at the state, so a change between the look and the wait still
wakes it.
"""

from __future__ import annotations

import asyncio


class ReceiveWaiters:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[str, asyncio.Event] = {}

    def register(self, topic: str) -> asyncio.Event:
        ev = self._events.get(topic)
        if ev is None:
            ev = self._events[topic] = asyncio.Event()
        return ev

    def dispatched(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        """A dispatch listener (the dispatch thread). Topics nobody waits on cost no wake-up;
        the unlocked look is safe for the reason ``long_polling`` gives."""
        if topic in self._events:
            self._loop.call_soon_threadsafe(self.wake, topic)

    def wake(self, topic: str) -> None:
        """On the event loop."""
        ev = self._events.pop(topic, None)
        if ev is not None:
            ev.set()

    def wake_all(self) -> None:
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()
