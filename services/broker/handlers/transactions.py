"""Transactions: EndTransaction, ListTransactions and the producers' WatchTransactionChecks
streams, handed to the ``TransactionService``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.transactions.service import TransactionService
from tidemq.services.errors import abort_with


class TransactionHandlers:
    def __init__(
        self, checks: BrokerChecks, service: TransactionService, metrics: BrokerMetrics | None
    ) -> None:
        self.checks = checks
        self.service = service
        self.metrics = metrics
        # Set at shutdown: every check stream ends.
        self.stopping = asyncio.Event()

    @typed_errors
    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.service.end(request)

    @typed_errors
    async def ListTransactions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self.service.listing(request)

    async def WatchTransactionChecks(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            self.checks.ensure_running()
            checks = self.service.watch(request, self.stopping)
        except Exception as e:  # noqa: BLE001 - every refusal is a typed status
            await abort_with(context, e)
        async for check in checks:
            yield check
