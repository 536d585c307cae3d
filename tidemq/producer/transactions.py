"""Transactions as applications see them (the names of RocketMQ 5's clients):
``TransactionResolution``, the ``TransactionChecker`` a producer answers the broker's checks
with, and ``Transaction`` / ``AsyncTransaction`` from ``producer.begin_transaction()``.

A transaction's messages are stored as half messages, invisible to consumers, until ``commit``
makes each visible in its topic (exactly once) or ``rollback`` discards them. A transaction
neither committed nor rolled back (the producer died, or its answer was lost) is checked: the
broker asks one producer of the group, through its checker, what became of it."""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidemq.protos import broker_pb2
from tidemq.types import ReceivedMessage, SendResult

if TYPE_CHECKING:
    from tidemq._runtime import LoopThread
    from tidemq.producer.transaction_sends import TransactionalSends


class TransactionResolution(enum.Enum):
    COMMIT = broker_pb2.COMMIT
    ROLLBACK = broker_pb2.ROLLBACK
    # Not known yet: the broker checks again after its check interval.
    UNKNOWN = broker_pb2.UNKNOWN


class TransactionChecker(abc.ABC):
    """Says what became of a transaction the broker found open (its local transaction, e.g. a
    database row, committed or not). Called on a worker thread of the producer."""

    @abc.abstractmethod
    def check(self, message: ReceivedMessage) -> TransactionResolution: ...


class AsyncTransactionChecker(abc.ABC):
    """``TransactionChecker`` for an ``AsyncProducer``: awaited on the producer's loop."""

    @abc.abstractmethod
    async def check(self, message: ReceivedMessage) -> TransactionResolution: ...


class _Messages:
    """The halves a transaction sent: (broker group, topic, transaction id)."""

    def __init__(self) -> None:
        self.halves: list[tuple[str, str, str]] = []
        self.ended = False


class AsyncTransaction:
    """``async with producer.begin_transaction() as tx``: commits at the end of the block,
    rolls back when it raises. ``send`` stores a half message; ``commit`` or ``rollback`` ends
    every half of the transaction (one broker group at a time: a transaction spanning groups
    is not atomic across them, each group's halves are)."""

    def __init__(self, sends: TransactionalSends) -> None:
        self._sends = sends
        self._state = _Messages()

    async def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        message_group: str | None = None,
    ) -> SendResult:
        self._check_open()
        result = await self._sends.send_half(topic, body, tag, keys, properties, message_group)
        self._state.halves.append((result.broker, topic, result.transaction_id))
        return result

    async def commit(self) -> None:
        await self._end(TransactionResolution.COMMIT)

    async def rollback(self) -> None:
        await self._end(TransactionResolution.ROLLBACK)

    async def _end(self, resolution: TransactionResolution) -> None:
        self._check_open()
        self._state.ended = True
        for broker, topic, txid in self._state.halves:
            await self._sends.end(broker, topic, txid, resolution)

    def _check_open(self) -> None:
        if self._state.ended:
            raise RuntimeError("the transaction is committed or rolled back already")

    @property
    def transaction_ids(self) -> list[str]:
        return [txid for _, _, txid in self._state.halves]

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: Any, *_: object) -> None:
        if self._state.ended:
            return
        if exc_type is not None:
            await self.rollback()
        else:
            await self.commit()


class Transaction:
    """The blocking ``AsyncTransaction``: ``with producer.begin_transaction() as tx``."""

    def __init__(self, sends: TransactionalSends, runner: LoopThread) -> None:
        self._tx = AsyncTransaction(sends)
        self._runner = runner

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tag: str | None = None,
        keys: Sequence[str] | str = (),
        properties: Mapping[str, str] | None = None,
        message_group: str | None = None,
    ) -> SendResult:
        return self._runner.run(
            self._tx.send(
                topic,
                body,
                tag=tag,
                keys=keys,
                properties=properties,
                message_group=message_group,
            )
        )

    def commit(self) -> None:
        self._runner.run(self._tx.commit())

    def rollback(self) -> None:
        self._runner.run(self._tx.rollback())

    @property
    def transaction_ids(self) -> list[str]:
        return self._tx.transaction_ids

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, *_: object) -> None:
        self._runner.run(self._tx.__aexit__(exc_type))
