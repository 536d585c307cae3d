"""The accumulator: per broker group (a lane), the open batch placed messages collect in, the
sealed batches waiting for the sender, and how many of the group's requests are in flight.
When a batch goes is told in the package docstring (``tidemq.producer``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemq.producer.blocks import Block
from tidemq.producer.config import ProducerConfig
from tidemq.producer.pending import Pending
from tidemq.producer.sender import Sender


@dataclass(eq=False)
class Lane:
    """The send path to one broker group."""

    broker: str
    open: list[Pending] = field(default_factory=list)
    open_bytes: int = 0
    ready: deque[Sequence[Pending | Block]] = field(default_factory=deque)
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
        # Called when a lane could send and has nothing ready: the producer hands over the
        # record blocks that grew meanwhile (``blocks.BlockCollector.take_open``).
        self.on_idle: Callable[[], None] | None = None

    def can_send(self) -> bool:
        """Whether a request could leave now: a lane (or a lane yet to be made) with a free
        slot and nothing waiting for it."""
        limit = self.config.max_in_flight_per_broker
        lanes = self._lanes.values()
        return not lanes or any(lane.in_flight < limit and not lane.ready for lane in lanes)

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

    def append_sealed(self, block: Block, broker: str) -> None:
        """Add a record block (sealed already, its queue chosen): it is one batch by itself."""
        lane = self._lanes.get(broker)
        if lane is None:
            lane = self._lanes[broker] = Lane(broker)
        lane.ready.append([block])
        self._pump(lane)

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
            batch: Sequence[Pending | Block]
            if lane.ready:
                batch = lane.ready.popleft()
            elif lane.open and self.config.linger_ms == 0:
                batch, lane.open, lane.open_bytes = lane.open, [], 0
            else:
                return
            lane.in_flight += 1
            self._spawn(self._deliver_on(lane, batch))

    async def _deliver_on(self, lane: Lane, batch: Sequence[Pending | Block]) -> None:
        try:
            await self._sender.deliver(batch)
        finally:
            lane.in_flight -= 1
            self._pump(lane)
            if self.on_idle is not None and lane.in_flight < self.config.max_in_flight_per_broker:
                self.on_idle()
