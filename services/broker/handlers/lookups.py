"""Lookups that read the store without consuming: messages by key or id, a queue's offset range,
the offset of a point in time."""

from __future__ import annotations

from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.convert import to_proto
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.errors import invalid
from tidemq.storage import MessageStore


class LookupHandlers:
    def __init__(
        self, checks: BrokerChecks, store: MessageStore, metrics: BrokerMetrics | None
    ) -> None:
        self.checks = checks
        self.store = store
        self.metrics = metrics

    @typed_errors
    async def QueryMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.checks.topic(request.topic, for_write=False)
        if not request.key:
            raise invalid("key is required")
        if request.max_messages < 0:
            raise invalid(f"max_messages {request.max_messages} is negative")
        end = request.end_timestamp_ms or 2**63 - 1
        found = self.store.query_by_key(
            request.topic,
            request.key,
            request.begin_timestamp_ms,
            end,
            request.max_messages or 32,
            max_bytes=self.checks.config.max_pull_response_bytes,
        )
        return broker_pb2.QueryMessageResponse(messages=[to_proto(m) for m in found])

    @typed_errors
    async def ViewMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return broker_pb2.ViewMessageResponse(
            message=to_proto(self.store.get_message_by_id(request.msg_id))
        )

    @typed_errors
    async def GetQueueOffsets(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cfg = self.checks.topic(request.topic, for_write=False)
        ids = list(request.queue_ids) or list(range(cfg.read_queue_nums))
        for q in ids:
            self.checks.check_queue(cfg, q, for_write=False)
        return broker_pb2.GetQueueOffsetsResponse(
            queues=[
                broker_pb2.QueueOffsets(
                    queue_id=q,
                    min_offset=self.store.min_offset(cfg.topic, q),
                    max_offset=self.store.max_offset(cfg.topic, q),
                )
                for q in ids
            ]
        )

    @typed_errors
    async def SearchOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cfg = self.checks.topic(request.topic, for_write=False)
        self.checks.check_queue(cfg, request.queue_id, for_write=False)
        return broker_pb2.SearchOffsetResponse(
            offset=self.store.offset_by_time(cfg.topic, request.queue_id, request.timestamp_ms)
        )
