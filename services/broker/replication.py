"""The broker's wiring of replication: the master's Replication service, whose refusals carry
typed errors (``replication/`` itself never imports ``services``)."""

from __future__ import annotations

from typing import NoReturn

import grpc

from protos import common_pb2
from replication import Identity, Refusal, RefusalKind
from replication.transport import REFUSAL_STATUS, ReplicationServicer
from services.broker.config import BrokerConfig
from services.errors import ServiceError, abort_with

_CODES = {
    RefusalKind.STRANGER: (common_pb2.NO_PERMISSION, False),
    RefusalKind.NOT_MASTER: (common_pb2.NOT_MASTER, True),
    RefusalKind.INCOMPATIBLE: (common_pb2.INVALID_ARGUMENT, False),
    RefusalKind.PROTOCOL: (common_pb2.INVALID_ARGUMENT, False),
    RefusalKind.NO_COMMON_HISTORY: (common_pb2.INVALID_ARGUMENT, False),
}


def identity(config: BrokerConfig) -> Identity:
    return Identity(config.cluster, config.broker_name, config.broker_id)


class TypedReplicationServicer(ReplicationServicer):
    """Refusals carry the ErrorDetail every tidemq error carries (services/errors.py)."""

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
