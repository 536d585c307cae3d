"""The push consumer's ack batching: acks of finished messages collect per (topic, broker
group), one AckMessage request per batch, sent when ``max_messages`` are waiting or
``linger_ms`` after the first one (``PendingAcks`` decides, ``AckBatcher`` sends)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tidemq.consumer.settling import SettleCall
from tidemq.errors import TidemqError
from tidemq.types import ReceivedMessage

log = logging.getLogger(__name__)

AckOutcome = Callable[[ReceivedMessage, "TidemqError | None"], None]


class PendingAcks:
    """Acks waiting to be sent, by (topic, broker group); no I/O, no clock."""

    def __init__(self, max_messages: int) -> None:
        if max_messages <= 0:
            raise ValueError("max_messages must be > 0")
        self.max_messages = max_messages
        self._batches: dict[tuple[str, str], list[ReceivedMessage]] = {}

    def add(self, message: ReceivedMessage) -> list[ReceivedMessage] | None:
        """Queue one ack; the batch it completed, to send now, or None."""
        key = (message.topic, message.broker)
        batch = self._batches.setdefault(key, [])
        batch.append(message)
        if len(batch) >= self.max_messages:
            del self._batches[key]
            return batch
        return None

    def take_all(self) -> list[list[ReceivedMessage]]:
        """Every waiting batch (the linger ended, or the consumer closes)."""
        batches, self._batches = list(self._batches.values()), {}
        return batches

    def __len__(self) -> int:
        return sum(len(b) for b in self._batches.values())


class AckBatcher:
    """Sends the batches ``PendingAcks`` makes; ``outcome`` hears each message's result (None:
    acknowledged). Runs on one event loop."""

    def __init__(
        self, ack: SettleCall, max_messages: int, linger_ms: int, outcome: AckOutcome
    ) -> None:
        self._ack = ack
        self._pending = PendingAcks(max_messages)
        self._linger_s = linger_ms / 1000
        self._outcome = outcome
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, message: ReceivedMessage) -> None:
        full = self._pending.add(message)
        if full is not None:
            self._send(full)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for batch in self._pending.take_all():
            self._send(batch)

    async def close(self) -> None:
        """Sends what is waiting and waits for every batch's answer."""
        self.flush()
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    def _send(self, batch: list[ReceivedMessage]) -> None:
        task = asyncio.ensure_future(self._deliver(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, batch: list[ReceivedMessage]) -> None:
        first = batch[0]
        errors: list[TidemqError | None]
        try:
            errors = await self._ack(first.topic, first.broker, [m.receipt_handle for m in batch])
        except TidemqError as e:
            log.warning("acking %d messages of %s failed: %s", len(batch), first.topic, e)
            errors = [e] * len(batch)
        for m, error in zip(batch, errors, strict=True):
            self._outcome(m, error)
