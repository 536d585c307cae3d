"""The broker's wiring of replication: the master's Replication service, whose refusals carry
typed errors (``replication/`` itself never imports ``services``), the replication part of
GetBrokerStatus, and the master's periodic slave-lag report."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication import Identity, Refusal, RefusalKind
from tidemq.replication.master_link import REFUSAL_STATUS, ReplicationServicer
from tidemq.replication.slave_link import SlaveClient
from tidemq.services.auth.guard import Refusal as AuthRefusal
from tidemq.services.auth.guard import Who
from tidemq.services.auth.on_the_wire import WireGuard, caller_of, current_caller
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.errors import ServiceError, abort_with
from tidemq.storage.clock import monotonic_ms

log = logging.getLogger(__name__)

REPLICATE_METHOD = "/tidemq.v1.Replication/Stream"

_CODES = {
    RefusalKind.STRANGER: (common_pb2.NO_PERMISSION, False),
    RefusalKind.NOT_MASTER: (common_pb2.NOT_MASTER, True),
    RefusalKind.INCOMPATIBLE: (common_pb2.INVALID_ARGUMENT, False),
    RefusalKind.PROTOCOL: (common_pb2.INVALID_ARGUMENT, False),
    RefusalKind.NO_COMMON_HISTORY: (common_pb2.INVALID_ARGUMENT, False),
    RefusalKind.STALE_EPOCH: (common_pb2.STALE_EPOCH, True),
}


def identity(config: BrokerConfig) -> Identity:
    return Identity(config.cluster, config.broker_name, config.broker_id)


class TypedReplicationServicer(ReplicationServicer):
    """Refusals carry the ErrorDetail every tidemq error carries (services/errors.py); with a
    guard, a slave replicates only as the broker its certificate names."""

    guard: WireGuard | None = None

    async def admit_peer(self, identity: Identity, context: grpc.aio.ServicerContext) -> None:
        if self.guard is None:
            return
        who = current_caller.get() or Who()
        try:
            self.guard.guard.replication_peer(who, identity.broker_name, identity.broker_id)
        except AuthRefusal as refusal:
            await self.guard.refuse(REPLICATE_METHOD, refusal, caller_of(context), context)

    async def refuse(self, context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
        code, retriable = _CODES[refusal.kind]
        await abort_with(
            context,
            ServiceError(
                REFUSAL_STATUS[refusal.kind],
                code,
                refusal.reason,
                retriable=retriable,
                min_offset=refusal.master_min_offset,
                max_offset=refusal.master_max_offset,
            ),
        )


def status_proto(
    config: BrokerConfig,
    master: ReplicationServicer | None,
    slave: SlaveClient | None,
    config_sync: ConfigSync | None,
) -> Any:
    """The replication part of GetBrokerStatus (and ``tidemq cluster status``)."""
    rs = broker_pb2.ReplicationStatus(
        confirm_offset_enabled=config.replication.confirm_offset,
        min_insync_replicas=config.replication.min_insync_replicas,
    )
    if master is not None:
        now = monotonic_ms()
        rs.confirmed_offset = master.confirmed_offset
        for lag in master.lags():
            rs.slaves.add(
                broker_id=lag.broker_id,
                address=lag.address,
                acked_offset=lag.acked_offset,
                lag_bytes=lag.lag_bytes,
                lag_seconds=lag.lag_seconds,
                in_sync=lag.in_sync,
                connected_for_ms=now - lag.connected_ms,
            )
    if slave is not None:
        session = slave.session
        rs.master_address = slave.master_address
        rs.connected = session is not None
        if session is not None:
            rs.master_max_offset = session.master_max_offset
            rs.lag_bytes = session.lag_bytes()
    if config_sync is not None:
        rs.last_config_sync_ms = config_sync.last_sync_ms
    return rs


def report_lag(config: BrokerConfig, master: ReplicationServicer) -> None:
    """The master's slave-lag report, one log line per slave (RocketMQ logs it every minute)."""
    lags = master.lags()
    if not lags:
        level = logging.WARNING if config.role.value == "SYNC_MASTER" else logging.INFO
        log.log(level, "replication lag report: no slave connected")
        return
    for lag in lags:
        seconds = "unknown" if lag.lag_seconds < 0 else f"{lag.lag_seconds:.3f} s"
        log.info(
            "replication lag report: slave %s/%d at %s is %d bytes and %s behind (%s)",
            config.broker_name,
            lag.broker_id,
            lag.address or "?",
            lag.lag_bytes,
            seconds,
            "in sync" if lag.in_sync else "NOT in sync",
        )
