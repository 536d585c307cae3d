"""The broker's services whose state is records of ``%SYS%`` logs in the CommitLog, as the broker
process wires them: the receive log (receive groups' in-flight state), the transaction logs
(halves and their op log) and the timer log (delayed messages' deliveries and recalls) — each
opened at start, followed on slaves, pinned for retention — and the services, collectors and
periodic tasks (revive, transaction checks, timer ticks) built on them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.idempotence.figures import IdempotenceCollector
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.periodic import every
from tidemq.services.broker.receive.figures import ReceiveCollector
from tidemq.services.broker.receive.journal import ReceiveJournal
from tidemq.services.broker.receive.revive import Reviver
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.receive.waiters import ReceiveWaiters
from tidemq.services.broker.replication import TypedReplicationServicer
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.servicer import BrokerServicer
from tidemq.services.broker.timer.figures import TimerMetrics
from tidemq.services.broker.timer.journal import TimerJournal
from tidemq.services.broker.timer.service import TimerService
from tidemq.services.broker.timer.wheel import TimerWheel
from tidemq.services.broker.topics import TopicManager
from tidemq.services.broker.transactions.figures import TransactionCollector
from tidemq.services.broker.transactions.log import TransactionLog
from tidemq.services.broker.transactions.service import TransactionService
from tidemq.storage import MessageStore
from tidemq.storage.cleaner import QueuePosition


@dataclass(frozen=True, slots=True)
class ServiceFactories:
    """The servicer's ``receive``, ``transactions`` and ``timer`` arguments: each service is
    built with the servicer's checks."""

    receive: Callable[[BrokerChecks], ReceiveService]
    transactions: Callable[[BrokerChecks], TransactionService]
    timer: Callable[[BrokerChecks], TimerService]


class LoggedServices:
    def __init__(self, config: BrokerConfig, store: MessageStore) -> None:
        self.config = config
        self.store = store
        # The receive log: receive groups' in-flight state as records in the CommitLog.
        self.journal = ReceiveJournal(store, config.store_dir)
        # Transactions: half messages and their op log, records in the CommitLog too.
        self.transaction_log = TransactionLog(store)
        # The timer log: delayed messages' deliveries and recalls as records in the CommitLog.
        self.timer_journal = TimerJournal(store)
        self.timer: TimerService | None = None
        self.reviver: Reviver | None = None
        self.servicer: BrokerServicer | None = None

    def pinned(self) -> tuple[Callable[[], QueuePosition | None], ...]:
        """What retention must keep of these logs (besides the receive log's own floor)."""
        return (
            self.transaction_log.retention_position,
            self.timer_journal.low_position,
            self.timer_journal.newest_position,
        )

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow each log and rebuild its state (after the store opened, before serving)."""
        self.journal.listen(loop)
        await loop.run_in_executor(None, self.journal.open)
        self.transaction_log.listen(loop)
        await loop.run_in_executor(None, self.transaction_log.open)
        self.timer_journal.listen(loop)
        await loop.run_in_executor(None, self.timer_journal.open)

    def factories(
        self,
        *,
        store: MessageStore,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        topics: TopicManager,
        receive_waiters: ReceiveWaiters,
        publish_topics: Callable[[], Awaitable[None]],
        replication: TypedReplicationServicer | None,
        confirm_cap: Callable[[], int | None],
        metrics: BrokerMetrics | None,
    ) -> ServiceFactories:
        """How the servicer builds the services; collectors of receive and transactions
        registered."""
        cfg = self.config

        def receive_service(checks: BrokerChecks) -> ReceiveService:
            return ReceiveService(
                cfg,
                store,
                self.journal,
                checks,
                groups,
                offsets,
                topics,
                receive_waiters,
                publish_topics,
                replication,
                confirm_cap,
                metrics,
            )

        def transaction_service(checks: BrokerChecks) -> TransactionService:
            return TransactionService(cfg, store, self.transaction_log, checks, replication)

        def timer_service(checks: BrokerChecks) -> TimerService:
            wheel = TimerWheel(os.path.join(cfg.store_dir, "timer"))
            counters = (
                TimerMetrics(metrics.registry, lambda: wheel.pending_count)
                if metrics is not None
                else None
            )
            self.timer = TimerService(
                cfg.broker_name,
                store,
                self.timer_journal,
                wheel,
                checks,
                cfg.max_delay_ms,
                replication,
                counters,
            )
            return self.timer

        if metrics is not None:
            metrics.registry.register(ReceiveCollector(lambda: self.journal.states, groups))
            metrics.registry.register(TransactionCollector(self._transaction_service))
        return ServiceFactories(receive_service, transaction_service, timer_service)

    def attach(
        self,
        servicer: BrokerServicer,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        role: RoleState,
        metrics: BrokerMetrics | None,
    ) -> None:
        """After the servicer is built: the idempotence collector and the reviver."""
        self.servicer = servicer
        assert self.timer is not None
        assert servicer.receive is not None
        if metrics is not None:
            metrics.registry.register(IdempotenceCollector(servicer.send.idempotence))
        self.reviver = Reviver(
            servicer.receive.service,
            servicer.receive.settle,
            self.journal,
            groups,
            offsets,
            role,
            self.config.receive_snapshot_interval_ms,
        )

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """What runs for as long as the broker does: the logs followed, the periodic tasks."""
        assert self.servicer is not None
        assert self.reviver is not None
        assert self.timer is not None
        cfg = self.config
        return [
            self.journal.follow(),
            self.servicer.send.idempotence.scan.follow(),
            every(cfg.revive_interval_ms, self.reviver.tick),
            self.transaction_log.follow(),
            every(self._transaction_round_ms(), self._check_round),
            self.timer_journal.follow(),
            every(cfg.timer_tick_ms, self.timer.tick),
        ]

    async def close(self) -> None:
        """At a clean stop, before the store closes."""
        if self.reviver is not None:
            await self.reviver.snapshot()  # a restart replays nothing
        if self.timer is not None:
            self.timer.wheel.close()  # a cache: the next start rebuilds it from the log

    def _transaction_service(self) -> TransactionService | None:
        s = self.servicer
        return s.transactions.service if s is not None and s.transactions is not None else None

    def _transaction_round_ms(self) -> int:
        # Often enough that a half is checked within about a tenth of its timeout or interval.
        cfg = self.config
        return max(50, min(cfg.transaction_check_interval_ms, cfg.transaction_timeout_ms) // 10)

    async def _check_round(self) -> None:
        service = self._transaction_service()
        if service is not None:
            await service.check_round()
