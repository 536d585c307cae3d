"""Consumer group administration: get, update, list and delete a group's model and settings.

Reads answer on any broker; updates and deletes are the master's (a slave gets them by config
sync, within ``config_sync_interval_ms``). Every value is validated before anything changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.groups import MODELS, SubscriptionGroupManager, group_proto
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.errors import group_not_found, invalid
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)


class GroupAdminHandlers:
    def __init__(
        self,
        checks: BrokerChecks,
        groups: SubscriptionGroupManager,
        metrics: BrokerMetrics | None,
        on_deleted: Callable[[str], object] | None = None,
    ) -> None:
        self.checks = checks
        self.groups = groups
        self.metrics = metrics
        # What else forgets a deleted group (the receive service: its in-flight state).
        self.on_deleted = on_deleted

    @typed_errors
    async def GetConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        group = self.groups.get(_name(request.group))
        if group is None:
            raise group_not_found(request.group)
        return broker_pb2.GetConsumerGroupResponse(group=group_proto(group))

    @typed_errors
    async def UpdateConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name = _name(request.group)
        self.checks.ensure_master("update consumer groups")
        if request.model and request.model not in MODELS:
            raise invalid(f"model {request.model} is not OFFSETS (1) or RECEIVE (2)")
        try:
            policy = (
                RetryPolicy.from_proto(request.retry_policy)
                if request.HasField("retry_policy")
                else None
            )
            group = self.groups.update(
                name,
                max_delivery_attempts=_field(request, "max_delivery_attempts"),
                retry_policy=policy,
                fifo=_field(request, "fifo"),
                consume_enabled=_field(request, "consume_enabled"),
                model=request.model or None,
                now_ms=now_ms(),
            )
        except ValueError as e:
            raise invalid(f"consumer group {name!r}: {e}") from None
        log.info("consumer group %s updated: model %d, %s", name, group.model, group.settings)
        return broker_pb2.UpdateConsumerGroupResponse(group=group_proto(group))

    @typed_errors
    async def ListConsumerGroups(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return broker_pb2.ListConsumerGroupsResponse(
            groups=[group_proto(g) for g in self.groups.all()]
        )

    @typed_errors
    async def DeleteConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name = _name(request.group)
        self.checks.ensure_master("delete consumer groups")
        if not self.groups.delete(name):
            raise group_not_found(name)
        if self.on_deleted is not None:
            self.on_deleted(name)
        log.info("consumer group %s deleted", name)
        return broker_pb2.DeleteConsumerGroupResponse()


def _name(group: str) -> str:
    if not group:
        raise invalid("group is required")
    return group


def _field(request: Any, name: str) -> Any:
    """An optional field's value, None when the request leaves it unset."""
    return getattr(request, name) if request.HasField(name) else None
