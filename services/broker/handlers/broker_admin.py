"""The broker as a whole: its status (store, replication, failover), a planned switchover of
its group's master, and the config sync a slave asks its master for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker import config_sync
from tidemq.services.broker.convert import broker_info, topic_proto
from tidemq.services.broker.daily_stats import DayTopic
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.runtime_config import RuntimeConfig
from tidemq.services.errors import ServiceError, invalid
from tidemq.storage import MessageStore
from tidemq.storage.clock import now_ms


class FailoverControl(Protocol):
    """Automatic failover as the Broker service exposes it."""

    def status(self) -> Any: ...

    async def switchover(self, target_broker_id: int) -> Any: ...


class BrokerAdminHandlers:
    def __init__(
        self,
        checks: BrokerChecks,
        store: MessageStore,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        replication_status: Callable[[], Any] | None,
        failover: FailoverControl | None,
        metrics: BrokerMetrics | None,
    ) -> None:
        self.checks = checks
        self.config = checks.config
        self.topics = checks.topics
        self.role = checks.role
        self.store = store
        self.groups = groups
        self.offsets = offsets
        self.replication_status = replication_status
        self.failover = failover
        self.metrics = metrics
        # Set by the servicer when the broker serves receive/ack consumption.
        self.receive: ReceiveService | None = None
        # Set by the servicer: the settings a slave's config sync copies.
        self.runtime: RuntimeConfig | None = None
        # Set by the server: the last N days' messages in/out per topic.
        self.daily: Callable[[int], list[DayTopic]] | None = None

    @typed_errors
    async def GetBrokerStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        st = self.store.stats()
        return broker_pb2.GetBrokerStatusResponse(
            broker=broker_info(self.config, self.topics, self.role),
            store=broker_pb2.StoreStatus(
                commitlog_min_offset=st.commitlog_min_offset,
                commitlog_max_offset=st.commitlog_max_offset,
                flushed_offset=st.flushed_offset,
                dispatched_offset=st.dispatched_offset,
                disk_usage_ratio=st.disk_usage_ratio,
                writable=st.writable,
            ),
            running=not self.checks.shutting_down,
            replication=self.replication_status() if self.replication_status else None,
            failover=self.failover.status() if self.failover is not None else None,
            daily=self._daily(request.daily_days),
        )

    def _daily(self, days: int) -> list[Any]:
        if days < 0:
            raise invalid(f"daily_days must be >= 0, got {days}")
        if days == 0 or self.daily is None:
            return []
        return [
            broker_pb2.DailyTopicStats(
                day=r.day, topic=r.topic, messages_in=r.messages_in, messages_out=r.messages_out
            )
            for r in self.daily(days)
        ]

    @typed_errors
    async def GetOffsetTable(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        stamp_ms = now_ms()
        out = broker_pb2.GetOffsetTableResponse(now_ms=stamp_ms)
        for t in self.topics.all():
            for q in range(t.read_queue_nums):
                out.queues.add(
                    topic=t.topic,
                    queue_id=q,
                    min_offset=self.store.min_offset(t.topic, q),
                    max_offset=self.store.max_offset(t.topic, q),
                )
        for c in self.offsets.entries():
            out.positions.add(group=c.group, topic=c.topic, queue_id=c.queue_id, offset=c.offset)
        receive = self.receive
        if receive is not None:
            states = receive.states
            keys = states.keys()
            for key in keys:
                state = states.get(key)
                if state is None:
                    continue
                policy = receive.settings(key.group).retry_policy
                inflight, retrying, _ = state.counts(stamp_ms, policy)
                out.positions.add(
                    group=key.group,
                    topic=key.topic,
                    queue_id=key.queue_id,
                    offset=state.floor,
                    receive=True,
                    inflight=inflight,
                    retrying=retrying,
                )
        return out

    @typed_errors
    async def Switchover(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.failover is None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.INVALID_ARGUMENT,
                "this broker runs classic master/slave (failover classic): no switchover",
                retriable=False,
            )
        if request.broker_name and request.broker_name != self.config.broker_name:
            raise invalid(
                f"this broker is in group {self.config.broker_name!r}, not {request.broker_name!r}"
            )
        self.checks.ensure_master("switch over")
        return await self.failover.switchover(request.target_broker_id)

    @typed_errors
    async def SyncConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return config_sync.answer(
            request,
            self.topics,
            self.groups,
            self.offsets,
            topic_proto,
            caller=context.peer(),
            runtime=self.runtime,
        )
