"""The wire side of transactions, on the producer's loop: half sends (SendMessage with
``transactional``), EndTransaction, and the check streams (WatchTransactionChecks) to the
masters the producer sends halves to (or is told to watch), answered by the checker.

Half sends and ends retry retriable errors (a group changing masters) within the send timeout;
a half is never moved to another broker group once stored, its end goes to whichever broker
masters its group now (the id names the half by its CommitLog offset, the same on every
replica). A check stream that breaks is opened again, to the group's master of the moment."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay

from tidemq._runtime import backoff
from tidemq.errors import (
    RouteNotFoundError,
    TransactionAlreadyResolved,
    from_rpc_error,
    is_retriable,
)
from tidemq.producer.pending import Pending
from tidemq.producer.sender import add_to_request
from tidemq.producer.transactions import (
    AsyncTransactionChecker,
    TransactionChecker,
    TransactionResolution,
)
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.types import ReceivedMessage, SendResult, send_status

if TYPE_CHECKING:
    from tidemq.producer.producer import AsyncProducer

log = logging.getLogger(__name__)

Checker = TransactionChecker | AsyncTransactionChecker
# A broken check stream is opened again after about this long.
REWATCH_S = 0.5


class TransactionalSends:
    def __init__(self, producer: AsyncProducer, checker: Checker | None) -> None:
        self.producer = producer
        self.config = producer.config
        self.checker = checker
        self.client_id = f"{self.config.group}@{random.getrandbits(48):012x}"
        self._watching: set[str] = set()

    # ------------------------------------------------------------------ halves and ends
    async def send_half(
        self,
        topic: str,
        body: bytes | str,
        tag: str | None,
        keys: Sequence[str] | str,
        properties: Mapping[str, str] | None,
        message_group: str | None,
    ) -> SendResult:
        core = self.producer
        core._check_open()
        future = asyncio.get_running_loop().create_future()
        p = core.pending(topic, body, tag, keys, properties, future, message_group)
        future.cancel()  # answered here, not through the producer's futures
        selector = core._selector
        avoid: set[str] = set()
        async for attempt in self._retrying():
            with attempt:
                route = await selector.route(topic)
                queue = selector.select(route, p, frozenset(avoid))
                group = route.groups[queue.broker_name]
                address = group.master or ""
                if not address:
                    avoid.add(queue.broker_name)
                    raise RouteNotFoundError(
                        f"broker group {queue.broker_name} has no master now",
                        code="NOT_MASTER",
                        retriable=True,
                    )
                request = broker_pb2.SendMessageRequest(
                    producer_group=self.config.group, epoch=group.epoch, transactional=True
                )
                p.queue = queue
                add_to_request(request, p)
                try:
                    resp = await self._stub(address).SendMessage(request, timeout=self._left(p))
                except grpc.aio.AioRpcError as e:
                    err = from_rpc_error(e, f"broker {queue.broker_name} at {address}")
                    if err.retriable:
                        avoid.add(queue.broker_name)
                        core.routes.invalidate(topic)
                    raise err from None
        r = resp.results[0]
        broker = resp.broker_name or queue.broker_name
        self.watch(broker, topic)
        return SendResult(
            send_status(r.status),
            r.msg_id,
            r.queue_id,
            r.queue_offset,
            broker,
            topic,
            r.commitlog_offset,
            epoch=resp.epoch,
            broker_address=address,
            transaction_id=r.transaction_id,
        )

    async def end(
        self,
        broker: str,
        topic: str,
        transaction_id: str,
        resolution: TransactionResolution,
        *,
        from_check: bool = False,
    ) -> broker_pb2.EndTransactionResponse:
        request = broker_pb2.EndTransactionRequest(
            producer_group=self.config.group,
            transaction_id=transaction_id,
            resolution=resolution.value,
            from_check=from_check,
        )
        tries = 0
        async for attempt in self._retrying():
            with attempt:
                tries += 1
                address = await self._master(broker, topic)
                try:
                    return await self._stub(address).EndTransaction(
                        request, timeout=self.config.send_timeout_ms / 1000
                    )
                except grpc.aio.AioRpcError as e:
                    err = from_rpc_error(e, f"broker {broker} at {address}")
                    if tries > 1 and isinstance(err, TransactionAlreadyResolved):
                        # An earlier attempt's answer was lost, not its end.
                        return broker_pb2.EndTransactionResponse()
                    if err.retriable:
                        self.producer.routes.invalidate(topic)
                    raise err from None
        raise AssertionError("unreachable: tenacity reraises")

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_delay(self.config.send_timeout_ms / 1000),
            wait=backoff(),
            retry=retry_if_exception(is_retriable),
            reraise=True,
        )

    def _left(self, p: Pending) -> float:
        return max(0.001, p.deadline - time.monotonic())

    def _stub(self, address: str) -> Any:
        return self.producer._channels.stub(address, broker_pb2_grpc.BrokerStub)

    async def _master(self, broker: str, topic: str) -> str:
        route = await self.producer._selector.route(topic)
        group = route.groups.get(broker)
        if group is None or group.master is None:
            self.producer.routes.invalidate(topic)
            raise RouteNotFoundError(
                f"broker group {broker} has no master now", code="NOT_MASTER", retriable=True
            )
        return group.master

    # ------------------------------------------------------------------ checks
    async def watch_topic(self, topic: str) -> None:
        """Watch the checks of every broker group serving ``topic``."""
        route = await self.producer._selector.route(topic)
        for broker in route.groups:
            self.watch(broker, topic)

    def watch(self, broker: str, topic: str) -> None:
        """Keep a check stream open to ``broker``'s master (once per group, with a checker)."""
        if self.checker is None or broker in self._watching:
            return
        self._watching.add(broker)
        self.producer._spawn(self._watch(broker, topic))

    async def _watch(self, broker: str, topic: str) -> None:
        request = broker_pb2.WatchTransactionChecksRequest(
            producer_group=self.config.group, client_id=self.client_id
        )
        while True:
            try:
                address = await self._master(broker, topic)
                stream = self._stub(address).WatchTransactionChecks(request)
                async for check in stream:
                    self.producer._spawn(self._answer(broker, topic, check))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the stream is opened again, whatever broke it
                log.debug("transaction check stream to %s: %s", broker, e)
            await asyncio.sleep(REWATCH_S + random.uniform(0, REWATCH_S))
            self.producer.routes.invalidate(topic)

    async def _answer(self, broker: str, topic: str, check: Any) -> None:
        assert self.checker is not None
        message = ReceivedMessage.from_proto(check.message, broker)
        try:
            if inspect.iscoroutinefunction(self.checker.check):
                resolution = await self.checker.check(message)
            else:
                loop = asyncio.get_running_loop()
                resolution = await loop.run_in_executor(None, self.checker.check, message)
        except Exception:  # the broker checks again later
            log.exception("transaction checker failed on %s", check.transaction_id)
            return
        if resolution is TransactionResolution.UNKNOWN:
            return
        try:
            await self.end(broker, topic, check.transaction_id, resolution, from_check=True)
        except Exception as e:  # noqa: BLE001 - the broker checks again later
            log.info("answering the check of %s: %s", check.transaction_id, e)
