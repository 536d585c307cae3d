"""Clients and their consumer offsets: heartbeats (group membership and subscriptions),
unregistering, a group's members, and committing and querying offsets."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.convert import parse_tag_expression
from tidemq.services.broker.groups import OFFSETS, SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.errors import invalid
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)


class ConsumerHandlers:
    def __init__(
        self,
        checks: BrokerChecks,
        clients: ClientRegistry,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        metrics: BrokerMetrics | None,
    ) -> None:
        self.checks = checks
        self.role = checks.role
        self.clients = clients
        self.groups = groups
        self.offsets = offsets
        self.metrics = metrics

    @typed_errors
    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.client_id:
            raise invalid("client_id is required")
        now = now_ms()
        memberships = []  # all validated before any is recorded
        for c in request.consumers:
            if not c.group:
                raise invalid("consumer group name is required")
            subs = {s.topic: s.tag_expression or "*" for s in c.subscriptions}
            for expr in subs.values():
                parse_tag_expression(expr)
            self.groups.check_model(c.group, c.model)
            memberships.append((c, subs))
        for c, subs in memberships:
            self.clients.heartbeat(request.client_id, c.group, c.mode, subs, now)
            if self.role.is_master and self.groups.observe(c.group, c.mode, subs, now, c.model):
                log.info(
                    "subscription group %s: mode %d, model %d, topics %s",
                    c.group,
                    c.mode,
                    c.model,
                    list(subs),
                )
        return broker_pb2.HeartbeatResponse()

    @typed_errors
    async def UnregisterClient(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.clients.unregister(request.client_id)
        return broker_pb2.UnregisterClientResponse()

    @typed_errors
    async def GetConsumerList(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        return broker_pb2.GetConsumerListResponse(
            client_ids=self.clients.members(request.group, now_ms())
        )

    @typed_errors
    async def CommitOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative")
        cfg = self.checks.topic(request.topic, for_write=False)
        self.checks.check_queue(cfg, request.queue_id, for_write=False)
        if not request.reset:
            # A receive group's offsets follow its acks; an operator's reset works for both.
            self.groups.check_model(request.group, OFFSETS)
        offset = self.offsets.commit(
            request.group,
            request.topic,
            request.queue_id,
            request.offset,
            reset=request.reset,
        )
        return broker_pb2.CommitOffsetResponse(offset=offset)

    @typed_errors
    async def QueryConsumerOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        offset = self.offsets.query(request.group, request.topic, request.queue_id)
        return broker_pb2.QueryConsumerOffsetResponse(found=offset is not None, offset=offset or 0)
