"""Delayed messages: RecallMessage and ListDelayedMessages, handed to the ``TimerService``
(which validates everything before it records anything)."""

from __future__ import annotations

from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.handlers.checks import typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.timer.service import TimerService

# A listing without a limit shows this many.
DEFAULT_LIST_LIMIT = 100


class DelayedHandlers:
    def __init__(self, service: TimerService, metrics: BrokerMetrics | None) -> None:
        self.service = service
        self.metrics = metrics  # ``typed_errors`` counts each call's outcome there

    @typed_errors
    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        recalled = await self.service.recall(request.topic, request.recall_handle)
        return broker_pb2.RecallMessageResponse(msg_id=recalled.msg_id)

    @typed_errors
    async def ListDelayedMessages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.service.list(request.topic, request.limit or DEFAULT_LIST_LIMIT)
