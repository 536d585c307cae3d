"""Auto-renewal of a push consumer's messages (v2 ``ReceiveMessage`` with ``auto_renew``), as
RocketMQ's proxy does it (spec §6.1): such a receive makes its messages invisible for 60 s, and
the broker itself extends that invisibility, 10 s before it ends (looked at every 5 s), while
the client is known (its settings or heartbeats, ``V2Clients``), for at most 3 h, until the
message is acked, its invisibility changed or it is dead-lettered.

Each renewal gives the message a new receipt handle; the client keeps the one it received.
So the broker keeps, per handle it gave out, the handle that works now (``current``), and an
ack, change or dead-lettering of the original is carried out with it. A renewal in progress
is waited for first, so such a call never uses a handle that the renewal just replaced.

In memory only: after a restart or a failover nothing is renewed, and a message whose 60 s
pass before its ack is delivered again (at least once holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemq.services.errors import ServiceError
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

RENEW_AHEAD_MS = 10_000
CHECK_INTERVAL_MS = 5_000
MAX_RENEW_MS = 3 * 3_600_000
# Handles renewed at most; beyond, a receive's messages keep their 60 s (and are delivered
# again if the consumer takes longer): the broker's memory stays bounded.
MAX_HELD = 100_000


class Due(enum.Enum):
    WAIT = "wait"
    RENEW = "renew"
    DROP = "drop"


def renewal_due(until_ms: int, received_ms: int, now: int) -> Due:
    """What to do with a held message at ``now``: renew it when its invisibility ends within
    RENEW_AHEAD_MS; drop it once that has ended (it is being delivered again) or once it has
    been renewed for MAX_RENEW_MS (then it is let expire)."""
    if now >= until_ms or now - received_ms >= MAX_RENEW_MS:
        return Due.DROP
    if until_ms - now <= RENEW_AHEAD_MS:
        return Due.RENEW
    return Due.WAIT


@dataclass(slots=True)
class Held:
    client_id: str
    group: str
    topic: str
    handle: str  # the one that works now
    until_ms: int
    received_ms: int
    renewing: asyncio.Future[None] | None = None


# (group, topic, handle, invisible_ms) -> (new handle, invisible until ms)
Change = Callable[[str, str, str, int], Awaitable[tuple[str, int]]]


class AutoRenewal:
    def __init__(
        self, change: Change, client_known: Callable[[str], bool], invisible_ms: int
    ) -> None:
        self._change = change
        self._client_known = client_known
        self.invisible_ms = invisible_ms
        self._held: dict[str, Held] = {}  # by the handle the client was given
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, client_id: str, group: str, topic: str, handles: list[tuple[str, int]]) -> None:
        """Renew these (handle, invisible until ms) of one receive from now on."""
        now = now_ms()
        for handle, until in handles:
            if len(self._held) >= MAX_HELD:
                log.warning(
                    "auto-renewal holds %d messages already; %d of group %s are not renewed",
                    MAX_HELD,
                    len(handles),
                    group,
                )
                break
            self._held[handle] = Held(client_id, group, topic, handle, until, now)
        if self._held and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def current(self, handle: str) -> str:
        """The handle that works now for one the client was given (itself when not renewed)."""
        held = self._held.get(handle)
        if held is None:
            return handle
        while held.renewing is not None:
            await asyncio.shield(held.renewing)
        return held.handle

    def forget(self, handle: str) -> None:
        """Stop renewing: the message was settled (acked, changed, dead-lettered)."""
        self._held.pop(handle, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._held.clear()

    async def _run(self) -> None:
        while self._held:
            await self.renew_due(now_ms())
            await asyncio.sleep(CHECK_INTERVAL_MS / 1000)

    async def renew_due(self, now: int) -> None:
        """One look: renew what is due, drop what is over or whose client is gone."""
        for original, held in list(self._held.items()):
            if held.renewing is not None:
                continue
            due = renewal_due(held.until_ms, held.received_ms, now)
            if due is Due.DROP or not self._client_known(held.client_id):
                self._held.pop(original, None)
            elif due is Due.RENEW:
                await self._renew(original, held)

    async def _renew(self, original: str, held: Held) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held.renewing = done
        try:
            held.handle, held.until_ms = await self._change(
                held.group, held.topic, held.handle, self.invisible_ms
            )
        except ServiceError as e:
            # Acked over tidemq's own protocol, expired, or this broker is no master now:
            # nothing to renew any more.
            log.debug("auto-renewal of a message of group %s stopped: %s", held.group, e)
            self._held.pop(original, None)
        except Exception:
            log.exception("auto-renewal of a message of group %s failed", held.group)
            self._held.pop(original, None)
        finally:
            held.renewing = None
            done.set_result(None)
