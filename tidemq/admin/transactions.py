"""Open transactions in the admin client (docs/production.md): half messages that were neither
committed nor rolled back yet, listed across the cluster's masters, oldest first (the ones the
checker asks about first). ``AsyncTransactions`` is mixed into ``AsyncAdmin``,
``Transactions`` into ``Admin``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tidemq._runtime import LoopThread
from tidemq.admin.masters import AcrossMasters, check_limit
from tidemq.protos import broker_pb2


@dataclass(frozen=True)
class OpenTransaction:
    """One open transaction: its half message, and how often the broker asked about it."""

    broker: str  # the broker group holding the half message
    transaction_id: str
    producer_group: str
    topic: str
    queue_id: int
    msg_id: str
    stored_at_ms: int
    checks: int
    last_check_ms: int | None  # None: never checked yet

    @classmethod
    def from_proto(cls, t: Any, broker: str) -> OpenTransaction:
        return cls(
            broker=broker,
            transaction_id=t.transaction_id,
            producer_group=t.producer_group,
            topic=t.topic,
            queue_id=t.queue_id,
            msg_id=t.msg_id,
            stored_at_ms=t.stored_at_ms,
            checks=t.checks,
            last_check_ms=t.last_check_ms or None,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OpenTransactions:
    """At most ``limit`` open transactions, oldest first, and how many are open in all."""

    transactions: list[OpenTransaction]
    total: int


class AsyncTransactions(AcrossMasters):
    """Mixed into ``AsyncAdmin``, which provides ``_call`` and ``masters``."""

    async def list_transactions(
        self, producer_group: str | None = None, *, limit: int = 100
    ) -> OpenTransactions:
        """Open transactions of ``producer_group`` (default: every group) on every master,
        oldest first; ``total`` counts them all, ``transactions`` holds at most ``limit``."""
        check_limit(limit)
        request = broker_pb2.ListTransactionsRequest(
            producer_group=producer_group or "", limit=limit
        )
        found, total = await self._list_on_masters(
            "ListTransactions",
            request,
            lambda resp, name: [OpenTransaction.from_proto(t, name) for t in resp.transactions],
            lambda t: (t.stored_at_ms, t.broker, t.transaction_id),
            limit,
        )
        return OpenTransactions(found, total)


class Transactions:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncTransactions
        _runner: LoopThread

    def list_transactions(
        self, producer_group: str | None = None, *, limit: int = 100
    ) -> OpenTransactions:
        return self._runner.run(self._core.list_transactions(producer_group, limit=limit))
