"""Receive/ack consumption: ReceiveMessage, AckMessage, NackMessage, ChangeInvisibleDuration,
DeadLetterMessage and GetReceiveState, handed to the ``ReceiveService`` (which validates
everything before it records anything); GetMessageHistory, a scan of the receive log
(``receive.history``)."""

from __future__ import annotations

from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker import tracing
from tidemq.services.broker.groups import RECEIVE
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.receive.history import message_history
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.receive.settle import Settlement


class ReceiveHandlers:
    def __init__(
        self, checks: BrokerChecks, service: ReceiveService, metrics: BrokerMetrics | None
    ) -> None:
        self.checks = checks
        self.service = service
        self.settle = Settlement(service)
        self.metrics = metrics

    @typed_errors
    async def ReceiveMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        encoded = await self.service.receive(request)
        tracer = tracing.TRACER
        if tracer is not None:
            count = len(broker_pb2.ReceiveMessageResponse.FromString(encoded).messages)
            if count:
                tracing.delivered(
                    tracer, "receive", request.topic, request.group, (encoded,), count
                )
        return encoded

    @typed_errors
    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.settle.ack(request.group, request.topic, request.receipt_handles)

    @typed_errors
    async def NackMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.settle.nack(request.group, request.topic, request.receipt_handles)

    @typed_errors
    async def ChangeInvisibleDuration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        handle, until = await self.settle.change_invisible_duration(
            request.group, request.topic, request.receipt_handle, request.invisible_duration_ms
        )
        return broker_pb2.ChangeInvisibleDurationResponse(
            receipt_handle=handle, invisible_until_ms=until
        )

    @typed_errors
    async def DeadLetterMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        topic, offset = await self.settle.dead_letter(
            request.group, request.topic, request.receipt_handle, request.reason
        )
        return broker_pb2.DeadLetterMessageResponse(dlq_topic=topic, dlq_queue_offset=offset)

    @typed_errors
    async def GetReceiveState(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self.service.state(request.group, request.topic)

    @typed_errors
    async def GetMessageHistory(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        s = self.service
        return await message_history(request, s.store, self.checks, s.offsets, s.groups, s.states)

    def is_receive_group(self, request: Any) -> bool:
        g = self.service.groups.get(request.group)
        return g is not None and g.model == RECEIVE

    @typed_errors
    async def ResetOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """CommitOffset with reset=True for a receive group."""
        offset = await self.settle.reset(
            request.group, request.topic, request.queue_id, request.offset
        )
        return broker_pb2.CommitOffsetResponse(offset=offset)
