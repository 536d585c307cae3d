"""One message on its way: what the producer accepts, the accumulator batches and the sender
puts on the wire, until its future is answered."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tidemq._runtime import now_ms
from tidemq.routes import MessageQueue
from tidemq.types import SendResult

if TYPE_CHECKING:
    from tidemq.producer.futures import MessageFuture

# What a message costs in a request beyond its body (topic, tag, keys, framing): an estimate,
# only used to keep batches under batch_max_bytes.
OVERHEAD_BYTES = 64


class Pending:
    """One message on its way. The wire form is built only when its request is (once per
    attempt), straight into the request: building a Message first would copy it twice."""

    __slots__ = (
        "batch_id",
        "body",
        "born_ms",
        "deadline",
        "delivery",
        "future",
        "keys",
        "producer_epoch",
        "properties",
        "queue",
        "sequence",
        "sharding_key",
        "size",
        "tag",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        tag: str,
        keys: tuple[str, ...],
        properties: Mapping[str, str] | None,
        future: asyncio.Future[SendResult] | MessageFuture,
        deadline: float,
        sharding_key: str | None,
    ) -> None:
        self.topic = topic
        self.body = body
        self.tag = tag
        self.keys = keys
        self.properties = properties
        self.born_ms = now_ms()
        self.size = len(body) + OVERHEAD_BYTES
        self.future = future
        self.deadline = deadline  # monotonic
        self.sharding_key = sharding_key
        self.queue: MessageQueue | None = None
        self.batch_id = 0  # send_batch: all of one id travel together, to one queue
        # Delayed delivery: (deliver_at_ms, delay_ms, delay_level) as the wire has them.
        self.delivery: tuple[int, int, int] | None = None
        # Idempotent producers (``idempotence``): given with the queue, kept through retries.
        self.sequence = -1
        self.producer_epoch = -1

    # One message (a ``Block`` has many): what the producer counts and sequences give it.
    count = 1

    def fail(self, error: BaseException) -> None:
        """Answer the message with ``error`` (unless it is answered already)."""
        if not self.future.done():
            self.future.set_exception(error)
