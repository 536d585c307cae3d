"""Transactions on the master: the send path's half records (``halves_of`` before the put,
``fill_results`` after), EndTransaction, ListTransactions, the check streams and the checker.

Every decision reads the open transactions and records its outcome (``TransactionLog.append``)
in the same step of the event loop, so two ends of one transaction can never both commit; the
answer then waits for the record as a send waits for its message. A master first applies every
record its logs hold and records as committed the halves whose committed copy is stored already
(``lead``), so it decides on the state its predecessor left."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import to_proto
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.leading import Leadership
from tidemq.services.broker.put_waits import wait_answerable
from tidemq.services.broker.transactions.events import Checked, Resolution, Resolved
from tidemq.services.broker.transactions.halves import (
    real_topic,
    to_committed,
    to_half,
    user_properties,
)
from tidemq.services.broker.transactions.ids import InvalidTransactionId, TransactionId
from tidemq.services.broker.transactions.log import LogBehindError, TransactionLog
from tidemq.services.broker.transactions.state import Action, OpenHalf
from tidemq.services.broker.transactions.streams import CheckStreams
from tidemq.services.errors import ServiceError, invalid, not_found
from tidemq.storage import Message, MessageStore, PutResult, PutStatus, StoredMessage
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

_RESOLUTIONS = {
    broker_pb2.COMMIT: Resolution.COMMIT,
    broker_pb2.ROLLBACK: Resolution.ROLLBACK,
}
MAX_LIST = 1000
# Halves a checker round acts on at most (the rest wait for the next round), and how many it
# handles between yields to other calls: each reads its half and looks it up in the index.
MAX_PER_ROUND = 2000
PER_STEP = 64


def _already_resolved(txid: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        common_pb2.TRANSACTION_ALREADY_RESOLVED,
        f"transaction {txid} was committed or rolled back already",
    )


class TransactionService:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        txlog: TransactionLog,
        checks: BrokerChecks,
        replication: ReplicationServicer | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.log = txlog
        self.checks = checks
        self.role = checks.role
        self.replication = replication
        self.streams = CheckStreams()
        # Counted since start: (resolution, by) and checks sent; read by the metrics collector.
        self.resolved: Counter[tuple[str, str]] = Counter()
        self.checks_sent = 0
        self.leadership = Leadership(checks, "end transactions", self._prepare)

    # ------------------------------------------------------------------ the master's gate
    async def lead(self) -> None:
        await self.leadership.lead()

    async def _prepare(self) -> None:
        await self.log.catch_up_fully()
        for h in self.log.repair():
            log.warning(
                "transaction %d: its committed message is stored but its op record "
                "was lost (a crash between them); recorded as committed",
                h.offset,
            )
            await self._durable(self._append(Resolved(h.offset, Resolution.COMMIT, False)))

    def _append(self, event: Resolved | Checked, before: list[Message] | None = None) -> PutResult:
        try:
            return self.log.append(event, before or ())
        except LogBehindError as e:
            raise self.leadership.behind("transactions are catching up with their log", e) from None

    async def _durable(self, put: PutResult) -> None:
        status = await wait_answerable(put, self.replication, self.checks)
        if status is not PutStatus.PUT_OK:
            log.warning("a transaction's end was answered short of its durability: %s", status)

    # ------------------------------------------------------------------ the send path
    @staticmethod
    def halves_of(request: Any, batch: list[Message]) -> list[Message]:
        """What a send stores: for a transactional send, each message's half record."""
        if not request.transactional:
            return batch
        if not request.producer_group:
            raise invalid("a transactional send names its producer_group (checks go to it)")
        return [to_half(m, request.producer_group) for m in batch]

    def fill_results(self, request: Any, response: Any, batch: list[Message]) -> None:
        """A transactional send's results: the transaction id, and the message's own queue."""
        if not request.transactional:
            return
        name = self.config.broker_name
        for result, m in zip(response.results, batch, strict=True):
            result.transaction_id = TransactionId(name, result.commitlog_offset).encode()
            result.queue_id = int(m.properties["REAL_QID"])
            result.queue_offset = 0  # its place in the queue is the commit's

    # ------------------------------------------------------------------ EndTransaction
    async def end(self, req: Any) -> Any:
        resolution = _RESOLUTIONS.get(req.resolution)
        if resolution is None and req.resolution != broker_pb2.UNKNOWN:
            raise invalid("resolution must be COMMIT, ROLLBACK or UNKNOWN")
        txid = self._parse(req.transaction_id)
        await self.lead()
        self.log.catch_up()  # the half may be dispatched and not yet applied
        h = self._open(txid, req.transaction_id)
        if req.producer_group and req.producer_group != h.group:
            raise invalid(
                f"transaction {req.transaction_id} belongs to producer group {h.group!r}, "
                f"not {req.producer_group!r}"
            )
        if resolution is None:
            return broker_pb2.EndTransactionResponse()  # the checker asks again later
        # An answer to a check is the producer's decision too: by="check" counts what the
        # broker resolved alone (exhaustion), the figure that says producers go missing.
        put, committed = self._resolve(h, resolution, by_check=False)
        await self._durable(put)
        if committed is None:
            return broker_pb2.EndTransactionResponse()
        r = put.results[0]
        return broker_pb2.EndTransactionResponse(msg_id=r.msg_id, queue_offset=r.queue_offset)

    def _parse(self, text: str) -> TransactionId:
        try:
            txid = TransactionId.decode(text)
        except InvalidTransactionId as e:
            raise invalid(str(e)) from None
        if txid.broker_name != self.config.broker_name:
            raise invalid(
                f"transaction {text} belongs to broker group {txid.broker_name!r}, "
                f"not {self.config.broker_name!r}"
            )
        return txid

    def _open(self, txid: TransactionId, text: str) -> OpenHalf:
        h = self.log.state.open.get(txid.half_offset)
        if h is not None:
            return h
        if self.log.state.was_half(txid.half_offset) and self.log.half(txid.half_offset):
            raise _already_resolved(text)
        raise not_found(
            f"transaction {text} is not open on this broker", common_pb2.TRANSACTION_NOT_FOUND
        )

    def _resolve(
        self, h: OpenHalf, resolution: Resolution, *, by_check: bool
    ) -> tuple[PutResult, Message | None]:
        """Record the resolution (a commit with its message first, in one put); no await."""
        committed = None
        if resolution is Resolution.COMMIT:
            half = self.log.half(h.offset)
            if half is None:
                raise not_found(
                    f"the half message of transaction at {h.offset} is gone (retention)",
                    common_pb2.TRANSACTION_NOT_FOUND,
                )
            committed = to_committed(half)
        put = self._append(
            Resolved(h.offset, resolution, by_check), [committed] if committed else None
        )
        by = "check" if by_check else "producer"
        self.resolved[resolution.name.lower(), by] += 1
        return put, committed

    # ------------------------------------------------------------------ listing and streams
    def listing(self, req: Any) -> Any:
        limit = req.limit if req.limit > 0 else 100
        halves, total = self.log.state.listing(req.producer_group or None, min(limit, MAX_LIST))
        out = broker_pb2.ListTransactionsResponse(total=total)
        name = self.config.broker_name
        for h in halves:
            out.transactions.add(
                transaction_id=TransactionId(name, h.offset).encode(),
                producer_group=h.group,
                topic=h.topic,
                queue_id=h.queue_id,
                msg_id=h.msg_id,
                stored_at_ms=h.stored_at_ms,
                checks=h.checks,
                last_check_ms=h.last_check_ms,
            )
        return out

    def watch(self, req: Any, stop: asyncio.Event) -> AsyncIterator[Any]:
        if not req.producer_group:
            raise invalid("producer_group is required")
        self.checks.ensure_master("send transaction checks")
        return self.streams.stream(req.producer_group, stop, lambda: self.role.is_master)

    # ------------------------------------------------------------------ the checker
    async def check_round(self) -> None:
        """One pass of the checker (master only): ask about halves left open, resolve those
        that used up their checks."""
        if not self.role.is_master or not self.role.may_acknowledge():
            return
        try:
            await self.lead()
        except ServiceError:
            return  # not master now, or not acknowledging: the next round looks again
        cfg = self.config
        now = now_ms()
        due = self.log.state.due(
            now,
            cfg.transaction_timeout_ms,
            cfg.transaction_check_interval_ms,
            cfg.transaction_check_max,
        )
        last: PutResult | None = None
        for i, (h, action) in enumerate(due[:MAX_PER_ROUND]):
            if i and not i % PER_STEP:
                await asyncio.sleep(0)
                if not self.role.is_master or not self.leadership.prepared:
                    break  # demoted meanwhile: the new master's checker takes over
            if h.offset not in self.log.state.open:
                continue  # resolved while this round waited
            half = self.log.half(h.offset)
            if half is None:
                continue
            if self.log.committed_copy(half) is not None:
                last = self._append(Resolved(h.offset, Resolution.COMMIT, False))
                continue
            if action is Action.EXHAUSTED:
                resolution = Resolution[cfg.transaction_exhausted_resolution.upper()]
                log.warning(
                    "transaction at %d of group %s: no answer after %d checks; %s",
                    h.offset,
                    h.group,
                    h.checks,
                    resolution.name.lower(),
                )
                last, _ = self._resolve(h, resolution, by_check=True)
                continue
            number = h.checks + 1
            last = self._append(Checked(h.offset, number, now))
            self.checks_sent += 1
            self.streams.push(h.group, self._check_message(h, half, number))
        if last is not None:
            await self._durable(last)

    def _check_message(self, h: OpenHalf, half: StoredMessage, number: int) -> Any:
        message = to_proto(half)
        topic, qid = real_topic(half)
        message.topic, message.queue_id = topic, qid
        message.properties.clear()
        message.properties.update(user_properties(half))
        return broker_pb2.TransactionCheck(
            transaction_id=TransactionId(self.config.broker_name, h.offset).encode(),
            message=message,
            check_number=number,
        )
