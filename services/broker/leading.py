"""The master's gate of a service whose state is a log of records (receive, the timer,
transactions): it refuses unless this broker is the master and may acknowledge, and before its
first decision in an epoch it brings its state up to the whole log (``prepare``), so it decides
on the state its predecessor left. An append that finds the log ahead of the state lapses the
gate: the next call prepares again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from tidemq.protos import common_pb2
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.errors import ServiceError


class Leadership:
    def __init__(
        self, checks: BrokerChecks, what: str, prepare: Callable[[], Awaitable[None]]
    ) -> None:
        self.checks = checks
        self.role = checks.role
        self.what = what  # "end transactions", in the refusal of a broker that is not master
        self.prepare = prepare
        self.epoch: int | None = None  # the epoch the state was prepared in
        self._lock = asyncio.Lock()

    @property
    def prepared(self) -> bool:
        """Whether the state is this epoch's (prepared since the role last changed)."""
        return self.epoch == self.role.epoch

    async def lead(self) -> None:
        checks = self.checks
        checks.ensure_running()
        checks.ensure_master(self.what)
        await checks.ensure_acknowledging(0)
        if self.prepared:
            return
        async with self._lock:
            if not self.prepared:
                epoch = self.role.epoch
                await self.prepare()
                self.epoch = epoch

    def behind(self, catching_up: str, e: Exception) -> ServiceError:
        """The refusal of an append that found records its state has not applied (``e``); the
        next call prepares again."""
        self.epoch = None
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            common_pb2.NOT_MASTER,
            f"{catching_up} ({e}); retry",
            retriable=True,
        )
