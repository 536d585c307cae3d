"""The Broker gRPC service: what gRPC registers, handing each RPC to the group of handlers that
owns its concern (``handlers``).

Every handler fails through ``abort_with``, so a bad request gets a typed status and never an
opaque UNKNOWN, and never changes anything before it is fully validated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2_grpc
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.handlers.broker_admin import BrokerAdminHandlers, FailoverControl
from tidemq.services.broker.handlers.broker_config import BrokerConfigHandlers
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.handlers.consumers import ConsumerHandlers
from tidemq.services.broker.handlers.delayed import DelayedHandlers
from tidemq.services.broker.handlers.group_admin import GroupAdminHandlers
from tidemq.services.broker.handlers.lookups import LookupHandlers
from tidemq.services.broker.handlers.pull import PullHandler
from tidemq.services.broker.handlers.receive import ReceiveHandlers
from tidemq.services.broker.handlers.send import SendHandler
from tidemq.services.broker.handlers.topic_admin import TopicAdminHandlers
from tidemq.services.broker.handlers.transactions import TransactionHandlers
from tidemq.services.broker.long_polling import PullWaiters
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.runtime_config import RuntimeConfig
from tidemq.services.broker.timer.service import TimerService
from tidemq.services.broker.topics import TopicManager
from tidemq.services.broker.transactions.service import TransactionService
from tidemq.storage import MessageStore


class BrokerServicer(broker_pb2_grpc.BrokerServicer):  # type: ignore[misc]
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicManager,
        offsets: OffsetManager,
        clients: ClientRegistry,
        waiters: PullWaiters,
        publish_topics: Callable[[], Awaitable[None]],
        groups: SubscriptionGroupManager,
        metrics: BrokerMetrics | None = None,
        replication: ReplicationServicer | None = None,
        replication_status: Callable[[], Any] | None = None,
        role: RoleState | None = None,
        confirm_cap: Callable[[], int | None] | None = None,
        log_epoch: Callable[[], int] | None = None,
        failover: FailoverControl | None = None,
        receive: Callable[[BrokerChecks], ReceiveService] | None = None,
        transactions: Callable[[BrokerChecks], TransactionService] | None = None,
        timer: Callable[[BrokerChecks], TimerService] | None = None,
        runtime_config: RuntimeConfig | None = None,
    ) -> None:
        role = role or RoleState.for_config(config.role, config.broker_id, False, 0)
        self.checks = checks = BrokerChecks(config, topics, role)
        self.waiters = waiters
        self.transactions = (
            TransactionHandlers(checks, transactions(checks), metrics)
            if transactions is not None
            else None
        )
        timer_service = timer(checks) if timer is not None else None
        self.delayed = (
            DelayedHandlers(timer_service, metrics) if timer_service is not None else None
        )
        self.send = SendHandler(
            checks,
            store,
            publish_topics,
            replication,
            metrics,
            self.transactions.service if self.transactions is not None else None,
            timer_service.scheduling if timer_service is not None else None,
        )
        self.pull = PullHandler(checks, store, waiters, confirm_cap, metrics, groups, log_epoch)
        self.lookups = LookupHandlers(checks, store, metrics)
        self.consumers = ConsumerHandlers(checks, clients, groups, offsets, metrics)
        self.topic_admin = TopicAdminHandlers(checks, publish_topics, metrics)
        self.broker_admin = BrokerAdminHandlers(
            checks, store, groups, offsets, replication_status, failover, metrics
        )
        self.group_admin = GroupAdminHandlers(checks, groups, metrics)
        runtime = runtime_config or RuntimeConfig(config, store.config, config.store_dir)
        self.broker_config = BrokerConfigHandlers(checks, runtime, metrics)
        self.broker_admin.runtime = runtime
        self.receive = (
            ReceiveHandlers(checks, receive(checks), metrics) if receive is not None else None
        )
        if self.receive is not None:
            self.broker_admin.receive = self.receive.service

    def stop_accepting(self) -> None:
        """Shutdown: new work is refused, and long polls in flight answer now."""
        self.checks.shutting_down = True
        self.waiters.wake_all()
        if self.receive is not None:
            self.receive.service.waiters.wake_all()
        if self.transactions is not None:
            self.transactions.stopping.set()

    # ------------------------------------------------------------------ send and pull
    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.send.SendMessage(request, context)

    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.pull.PullMessage(request, context)

    # ------------------------------------------------------------------ lookups
    async def QueryMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.lookups.QueryMessage(request, context)

    async def ViewMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.lookups.ViewMessage(request, context)

    async def GetQueueOffsets(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.lookups.GetQueueOffsets(request, context)

    async def SearchOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.lookups.SearchOffset(request, context)

    # ------------------------------------------------------------------ clients and offsets
    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.consumers.Heartbeat(request, context)

    async def UnregisterClient(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.consumers.UnregisterClient(request, context)

    async def GetConsumerList(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.consumers.GetConsumerList(request, context)

    async def CommitOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.receive is not None and request.reset and self.receive.is_receive_group(request):
            # An operator's reset of a receive group: its in-flight state starts over there.
            return await self.receive.ResetOffset(request, context)
        return await self.consumers.CommitOffset(request, context)

    async def QueryConsumerOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.consumers.QueryConsumerOffset(request, context)

    # ------------------------------------------------------------------ topics
    async def CreateTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.topic_admin.CreateTopic(request, context)

    async def DeleteTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.topic_admin.DeleteTopic(request, context)

    async def ListTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.topic_admin.ListTopics(request, context)

    # ------------------------------------------------------------------ the broker
    async def GetBrokerStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_admin.GetBrokerStatus(request, context)

    async def GetOffsetTable(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_admin.GetOffsetTable(request, context)

    async def Switchover(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_admin.Switchover(request, context)

    async def SyncConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_admin.SyncConfig(request, context)

    async def GetBrokerConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_config.GetBrokerConfig(request, context)

    async def UpdateBrokerConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.broker_config.UpdateBrokerConfig(request, context)

    # ------------------------------------------------------------------ consumer groups
    async def GetConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.group_admin.GetConsumerGroup(request, context)

    async def UpdateConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.group_admin.UpdateConsumerGroup(request, context)

    async def ListConsumerGroups(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.group_admin.ListConsumerGroups(request, context)

    async def DeleteConsumerGroup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.group_admin.DeleteConsumerGroup(request, context)

    # ------------------------------------------------------------------ receive/ack
    def _receive(self) -> ReceiveHandlers:
        assert self.receive is not None, "a broker serving receive/ack is built with its service"
        return self.receive

    async def ReceiveMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().ReceiveMessage(request, context)

    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().AckMessage(request, context)

    async def NackMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().NackMessage(request, context)

    async def ChangeInvisibleDuration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().ChangeInvisibleDuration(request, context)

    async def DeadLetterMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().DeadLetterMessage(request, context)

    async def GetReceiveState(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().GetReceiveState(request, context)

    async def GetMessageHistory(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._receive().GetMessageHistory(request, context)

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> TransactionHandlers:
        assert self.transactions is not None, "a broker serving transactions is built with them"
        return self.transactions

    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._transactions().EndTransaction(request, context)

    async def ListTransactions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._transactions().ListTransactions(request, context)

    async def WatchTransactionChecks(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        # An async generator itself: gRPC tells a streaming handler by its function's kind.
        async for check in self._transactions().WatchTransactionChecks(request, context):
            yield check

    # ------------------------------------------------------------------ delayed delivery
    def _delayed(self) -> DelayedHandlers:
        assert self.delayed is not None, "a broker serving delayed delivery has its timer"
        return self.delayed

    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._delayed().RecallMessage(request, context)

    async def ListDelayedMessages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._delayed().ListDelayedMessages(request, context)
