"""What every Broker handler checks before it acts, and how any failure becomes a typed answer.

``typed_errors`` wraps each RPC handler; ``BrokerChecks`` holds the checks the groups share
(topic and queue, role, lease, running), so each refusal is worded and typed in one place.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tidemq.protos import common_pb2
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import PERM_READ, PERM_WRITE, TopicConfig, TopicManager
from tidemq.services.errors import ServiceError, abort_with, invalid, not_found, to_service_error
from tidemq.storage.clock import monotonic_ms
from tidemq.storage.errors import StoreError

log = logging.getLogger(__name__)

R = TypeVar("R")
Handler = Callable[..., Awaitable[R]]


def typed_errors(fn: Handler[R]) -> Handler[R]:
    """Any exception a handler raises becomes a typed status (unknown ones: INTERNAL, logged)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        metrics: BrokerMetrics | None = self.metrics
        try:
            response = await fn(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:
            if not isinstance(e, ServiceError | StoreError):  # typed errors are answers, not bugs
                log.exception("%s failed", fn.__name__)
            err = to_service_error(e)
            if metrics is not None:
                metrics.rpc(fn.__name__, common_pb2.ErrorCode.Name(err.code))
            await abort_with(context, err)
        if metrics is not None:
            metrics.rpc(fn.__name__, "OK")
        return response

    return wrapper


class BrokerChecks:
    """The checks the handler groups share, over the broker's topics and role; one per broker.

    ``shutting_down`` is set once, at shutdown: from then on ``ensure_running`` refuses new
    work, and a long poll in flight answers as soon as it is woken."""

    def __init__(self, config: BrokerConfig, topics: TopicManager, role: RoleState) -> None:
        self.config = config
        self.topics = topics
        self.role = role
        self.shutting_down = False

    def topic(self, name: str, *, for_write: bool) -> TopicConfig:
        cfg = self.topics.get(name)
        if cfg is None:
            raise not_found(
                f"topic {name!r} does not exist on this broker", common_pb2.TOPIC_NOT_FOUND
            )
        need = PERM_WRITE if for_write else PERM_READ
        if not cfg.perm & need:
            raise ServiceError(
                grpc.StatusCode.PERMISSION_DENIED,
                common_pb2.NO_PERMISSION,
                f"topic {name!r} is not {'writable' if for_write else 'readable'} here",
            )
        return cfg

    def check_queue(self, cfg: TopicConfig, queue_id: int, *, for_write: bool) -> None:
        limit = cfg.write_queue_nums if for_write else cfg.read_queue_nums
        if not 0 <= queue_id < limit:
            raise invalid(
                f"queue {queue_id} of {cfg.topic!r} does not exist (0..{limit - 1})",
                common_pb2.INVALID_QUEUE_ID,
            )

    def ensure_master(self, what: str) -> None:
        if not self.role.is_master:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.NOT_MASTER,
                f"this broker is a slave; {what} on the master of its group",
                retriable=True,
            )

    async def ensure_acknowledging(self, request_epoch: int) -> None:
        """Under automatic failover: refuse a send this broker could not acknowledge (it has
        been superseded, or its lease lapsed); a new master waits out its predecessor's lease
        (at most one lease) rather than refuse."""
        role = self.role
        if not role.automatic:
            return
        if request_epoch > role.epoch:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.STALE_EPOCH,
                f"this broker serves epoch {role.epoch}; the route names epoch {request_epoch}",
                retriable=True,
            )
        wait_ms = role.ack_from_ms - monotonic_ms()
        if role.is_master and 0 < wait_ms <= role.lease_ms:
            await asyncio.sleep(wait_ms / 1000)
        self.check_lease()

    def check_lease(self) -> None:
        if not self.role.may_acknowledge():
            raise self.not_acknowledging()

    def not_acknowledging(self) -> ServiceError:
        """The refusal of a write this broker may not acknowledge now."""
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            common_pb2.NOT_MASTER,
            f"broker {self.config.broker_name}/{self.role.own_id} cannot acknowledge "
            f"writes now (not the master, or its ZooKeeper lease lapsed); the group's "
            f"master is in the routes",
            retriable=True,
        )

    def ensure_running(self) -> None:
        if self.shutting_down:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.SHUTTING_DOWN,
                "broker is shutting down",
                retriable=True,
            )
