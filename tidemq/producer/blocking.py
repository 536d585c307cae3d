"""The blocking producer, ``Producer``: runs an ``AsyncProducer`` on a background loop; its
``send_async`` futures are answered from that loop (``futures``)."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidemq._runtime import LoopThread
from tidemq.errors import ClientClosedError
from tidemq.producer.config import ProducerStats
from tidemq.producer.futures import MessageFuture, SendFuture
from tidemq.producer.producer import AsyncProducer, is_plain
from tidemq.producer.transactions import Transaction
from tidemq.types import Message, SendResult


class Producer:
    """The blocking producer. ``send`` waits for the broker's answer; ``send_async`` returns a
    ``concurrent.futures.Future`` at once, so a loop of ``send_async`` calls is batched into
    few RPCs. Thread-safe. Use as a context manager, or call ``close()``::

        with tidemq.Producer(nameserver="127.0.0.1:9876") as producer:
            result = producer.send("orders", b'{"id": 1}', tag="created", keys=["order-1"])
    """

    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        self._core = AsyncProducer(nameserver, **settings)
        self.config = self._core.config
        self._hub = self._core.hub
        self._submitted = itertools.count()  # messages accepted, answered or not
        self._refunded = 0  # of those, refused after they were counted
        self._limit = self.config.buffer_max_messages
        self._submit_lock = threading.Lock()
        self._runner = LoopThread("tidemq-producer")
        try:
            self._runner.run(self._core.start())
        except BaseException:
            self._runner.stop()
            raise

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        message_group: str | None = None,
        deliver_at: dt.datetime | int | None = None,
        delay: dt.timedelta | float | None = None,
        delay_level: int | None = None,
    ) -> SendResult:
        return self.send_async(
            topic,
            body,
            tag=tag,
            keys=keys,
            properties=properties,
            sharding_key=sharding_key,
            message_group=message_group,
            deliver_at=deliver_at,
            delay=delay,
            delay_level=delay_level,
        ).result()

    def send_async(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        message_group: str | None = None,
        deliver_at: dt.datetime | int | None = None,
        delay: dt.timedelta | float | None = None,
        delay_level: int | None = None,
    ) -> SendFuture:
        blocks = self._core.blocks
        if blocks is not None and is_plain(sharding_key, message_group, deliver_at, delay,
                                         delay_level):  # fmt: skip
            self._admit()
            try:
                return blocks.add(topic, body, tag, keys, properties)
            except ClientClosedError as e:
                # As for any send: a closed producer answers the future, it does not raise.
                closed = MessageFuture(self._hub)
                closed.set_exception(e)  # counted as answered
                return closed
            except BaseException:
                self._refund()
                raise
        future = MessageFuture(self._hub)
        pending = self._core.pending(
            topic,
            body,
            tag,
            keys,
            properties,
            future,
            sharding_key,
            message_group=message_group,
            deliver_at=deliver_at,
            delay=delay,
            delay_level=delay_level,
        )
        self._admit()
        try:
            self._core.submit_threadsafe(pending)
        except ClientClosedError as e:
            future.set_exception(e)
        return future

    def _admit(self) -> None:
        """Count one more message, waiting while ``buffer_max_messages`` are unanswered. The
        count is ``itertools.count``'s (one C call, atomic between threads): no lock per
        message; a message refused after it was counted is counted back (``_refund``)."""
        hub = self._hub
        before = next(self._submitted)  # messages accepted before this one
        if before - self._refunded - hub.completed < self._limit:
            return
        # Memory bound: wait until the broker has answered enough of what is queued.
        with self._submit_lock:
            hub.wait_for(lambda: before - self._refunded - hub.completed < self._limit, None)

    def _refund(self) -> None:
        with self._submit_lock:
            self._refunded += 1

    def send_batch(self, messages: Iterable[Message]) -> list[SendResult]:
        return self._runner.run(self._core.send_batch(list(messages)))

    def begin_transaction(self) -> Transaction:
        """A transaction: its sends are invisible until it commits (``transactions``)."""
        self._core._check_open()
        return Transaction(self._core._transactions, self._runner)

    def flush(self) -> None:
        self._runner.run(self._core.flush())

    def recall(self, topic: str, recall_handle: str) -> str:
        """``AsyncProducer.recall``."""
        return self._runner.run(self._core.recall(topic, recall_handle))

    @property
    def stats(self) -> ProducerStats:
        return self._core.stats

    def close(self) -> None:
        self._runner.finish(self._core.close)
