"""Transactions and recalls over the RocketMQ 5 protocol: EndTransaction (a client's decision or
its answer to a check), the broker's checks of a producer's open transactions pushed down its
Telemetry stream as ``recover_orphaned_transaction_command``, and RecallMessage of a delayed
message. The producer group of a v2 transaction is its topic, as with the Apache proxy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.broker.handlers.delayed import DelayedHandlers
from tidemq.services.broker.handlers.transactions import TransactionHandlers
from tidemq.services.broker.rocketmq.clients import V2Client
from tidemq.services.broker.rocketmq.messages import stored_to_v2
from tidemq.services.broker.rocketmq.settings import published_topics
from tidemq.services.broker.rocketmq.status import StatusError, ok

log = logging.getLogger(__name__)

C = definition_pb2
_RESOLUTIONS = {
    C.COMMIT: broker_pb2.COMMIT,
    C.ROLLBACK: broker_pb2.ROLLBACK,
    # The producer does not know yet: checked again later.
    C.TRANSACTION_RESOLUTION_UNSPECIFIED: broker_pb2.UNKNOWN,
}
# A producer's stream to a broker that cannot check now (a slave) looks again this often: a
# failover may make it the master.
RETRY_WATCH_S = 1.0


class V2Transactions:
    def __init__(
        self, transactions: TransactionHandlers | None, delayed: DelayedHandlers | None
    ) -> None:
        self.transactions = transactions
        self.delayed = delayed
        self._tasks: set[asyncio.Task[None]] = set()

    async def end(
        self, request: service_pb2.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.EndTransactionResponse:
        if self.transactions is None:
            raise StatusError(C.NOT_IMPLEMENTED, "this broker takes no transactions")
        if not request.transaction_id:
            raise StatusError(C.INVALID_TRANSACTION_ID, "transaction_id is required")
        if not request.topic.name:
            raise StatusError(C.ILLEGAL_TOPIC, "topic.name is required")
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            raise StatusError(C.BAD_REQUEST, f"unknown resolution {request.resolution}")
        ours = broker_pb2.EndTransactionRequest(
            producer_group=request.topic.name,
            transaction_id=request.transaction_id,
            resolution=resolution,
            from_check=request.source == C.SOURCE_SERVER_CHECK,
        )
        # The handler's own function: its errors come back as exceptions, answered as a Status.
        handle: Any = TransactionHandlers.EndTransaction.__wrapped__  # type: ignore[attr-defined]
        await handle(self.transactions, ours, context)
        return service_pb2.EndTransactionResponse(status=ok())

    async def recall(
        self, request: service_pb2.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.RecallMessageResponse:
        if self.delayed is None:
            raise StatusError(C.NOT_IMPLEMENTED, "this broker takes no delayed messages")
        if not request.recall_handle:
            raise StatusError(C.BAD_REQUEST, "recall_handle is required")
        recalled = await self.delayed.service.recall(request.topic.name, request.recall_handle)
        # The id its send answered: the client's own, as SendMessage answers it.
        message_id = recalled.client_message_id or recalled.msg_id
        return service_pb2.RecallMessageResponse(status=ok(), message_id=message_id)

    # ------------------------------------------------------------------ checks
    def watch_checks(self, client: V2Client) -> None:
        """Feed the client's stream the checks of every topic its settings publish to (once
        per topic and stream)."""
        if self.transactions is None or client.settings is None:
            return
        for topic in published_topics(client.settings):
            if topic in client.watched:
                continue
            client.watched.add(topic)
            task = asyncio.create_task(self._feed(client, topic, client.stream_closed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _feed(self, client: V2Client, topic: str, closed: asyncio.Event) -> None:
        assert self.transactions is not None
        request = broker_pb2.WatchTransactionChecksRequest(
            producer_group=topic, client_id=client.client_id
        )
        while not closed.is_set():
            try:
                checks = self.transactions.service.watch(request, closed)
                async for check in checks:
                    client.send(recover_command(check))
            except Exception as e:  # noqa: BLE001 - not the master now: look again soon
                log.debug("transaction checks of %r for %s: %s", topic, client.client_id, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), RETRY_WATCH_S)


def recover_command(check: Any) -> service_pb2.TelemetryCommand:
    """One of our TransactionChecks as the command the official clients answer."""
    message = stored_to_v2(check.message)
    message.system_properties.message_type = C.TRANSACTION
    return service_pb2.TelemetryCommand(
        status=ok(),
        recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=check.transaction_id
        ),
    )
