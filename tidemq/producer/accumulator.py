"""The accumulator: per broker group (a lane), the open batch placed messages collect in, the
sealed batches waiting for the sender, and how many of the group's requests are in flight.
When a batch goes is told in the package docstring (``tidemq.producer``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tidemq.producer.config import ProducerConfig
from tidemq.producer.pending import Pending
from tidemq.producer.sender import Sender


@dataclass(eq=False)
class Lane:
    """The send path to one broker group."""

    broker: str
    open: list[Pending] = field(default_factory=list)
    open_bytes: int = 0
    ready: deque[list[Pending]] = field(default_factory=deque)
    in_flight: int = 0
    timer: asyncio.TimerHandle | None = None
    flush_scheduled: bool = False


class Accumulator:
    """Batches placed messages per broker group and hands them to ``sender``, at most
    ``max_in_flight_per_broker`` at a time per group. ``spawn`` runs a delivery as a task the
    producer owns (and cancels at close). Runs on the producer's loop only."""

    def __init__(
        self,
        config: ProducerConfig,
        sender: Sender,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self.config = config
        self._sender = sender
        self._spawn = spawn
        self._lanes: dict[str, Lane] = {}

    def append(self, p: Pending, broker: str) -> None:
        """Add a message whose queue is chosen (on ``broker``'s group) to that group's batch."""
        lane = self._lanes.get(broker)
        if lane is None:
            lane = self._lanes[broker] = Lane(broker)
        lane.open.append(p)
        lane.open_bytes += p.size
        cfg = self.config
        if len(lane.open) >= cfg.batch_max_messages or lane.open_bytes >= cfg.batch_max_bytes:
            self._seal(lane)
            self._pump(lane)
        elif cfg.linger_ms > 0:
            if lane.timer is None:
                lane.timer = asyncio.get_running_loop().call_later(
                    cfg.linger_ms / 1000, self._linger_done, lane
                )
        elif not lane.flush_scheduled:
            # Everything placed in this loop iteration (a drained inbox) shares one batch.
            lane.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_lane, lane)

    def flush(self) -> None:
        """Seal every open batch and send what the in-flight limits allow now."""
        for lane in self._lanes.values():
            self._seal(lane)
            self._pump(lane)

    def _linger_done(self, lane: Lane) -> None:
        lane.timer = None
        self._seal(lane)
        self._pump(lane)

    def _flush_lane(self, lane: Lane) -> None:
        lane.flush_scheduled = False
        self._pump(lane)

    def _seal(self, lane: Lane) -> None:
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        if lane.open:
            lane.ready.append(lane.open)
            lane.open, lane.open_bytes = [], 0

    def _pump(self, lane: Lane) -> None:
        while lane.in_flight < self.config.max_in_flight_per_broker:
            if lane.ready:
                batch = lane.ready.popleft()
            elif lane.open and self.config.linger_ms == 0:
                batch, lane.open, lane.open_bytes = lane.open, [], 0
            else:
                return
            lane.in_flight += 1
            self._spawn(self._deliver_on(lane, batch))

    async def _deliver_on(self, lane: Lane, batch: list[Pending]) -> None:
        try:
            await self._sender.deliver(batch)
        finally:
            lane.in_flight -= 1
            self._pump(lane)
