"""GetBrokerConfig and UpdateBrokerConfig: the broker's settings, and the runtime change of those
that apply without a restart (``runtime_config``). Changes are taken on the master only: its
slaves copy them with the config sync, so a group keeps one set of settings."""

from __future__ import annotations

from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.convert import broker_info
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.runtime_config import Entry, RuntimeConfig, RuntimeConfigError
from tidemq.services.errors import invalid


def _entries(entries: list[Entry]) -> list[Any]:
    return [
        broker_pb2.BrokerConfigEntry(
            key=e.key, value=e.value, file_value=e.file_value, changeable=e.changeable
        )
        for e in entries
    ]


class BrokerConfigHandlers:
    def __init__(
        self, checks: BrokerChecks, runtime: RuntimeConfig, metrics: BrokerMetrics | None
    ) -> None:
        self.checks = checks
        self.runtime = runtime
        self.metrics = metrics  # typed_errors counts refusals in it

    @typed_errors
    async def GetBrokerConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        c = self.checks
        return broker_pb2.GetBrokerConfigResponse(
            broker=broker_info(c.config, c.topics, c.role),
            entries=_entries(self.runtime.entries()),
        )

    @typed_errors
    async def UpdateBrokerConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.checks.ensure_master("change settings (its slaves copy them)")
        try:
            changed = self.runtime.update(dict(request.changes))
        except RuntimeConfigError as e:
            raise invalid(str(e)) from None
        wanted = set(request.changes)
        return broker_pb2.UpdateBrokerConfigResponse(
            changed=changed,
            entries=_entries([e for e in self.runtime.entries() if e.key in wanted]),
        )
