"""Topic changes reach the registry in registration rounds.

A send that auto-creates a topic, or a CreateTopic call, should not answer before the
nameservers know the topic: a consumer started right after the producer would otherwise be
told ROUTE_NOT_FOUND. Each change takes a ticket; a round started after the ticket was taken
carries the change, and waiters are released when such a round has finished.
"""

from __future__ import annotations

import asyncio
import contextlib


class RegistrationRounds:
    def __init__(self) -> None:
        self._requested = 0
        self._finished = 0
        self._wanted = asyncio.Event()
        self._progress = asyncio.Condition()

    def request(self) -> int:
        """Ask for a round soon; the ticket identifies the change it must carry."""
        self._requested += 1
        self._wanted.set()
        return self._requested

    async def next_round(self, interval_s: float) -> int:
        """Wait until a round is wanted or ``interval_s`` passed; returns the round's ticket.

        The event is cleared before the round runs, so a change made during a round gets
        a round of its own instead of being lost until the next interval."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await self._wanted.wait()
        self._wanted.clear()
        return self._requested

    async def finished(self, ticket: int) -> None:
        async with self._progress:
            self._finished = max(self._finished, ticket)
            self._progress.notify_all()

    async def published(self, ticket: int, timeout_s: float) -> bool:
        """Wait for a round carrying ``ticket``; False when it did not finish in time
        (a nameserver down): the change still goes out with a later round."""
        try:
            async with asyncio.timeout(timeout_s), self._progress:
                await self._progress.wait_for(lambda: self._finished >= ticket)
        except TimeoutError:
            return False
        return True

    async def publish(self, timeout_s: float) -> bool:
        return await self.published(self.request(), timeout_s)
