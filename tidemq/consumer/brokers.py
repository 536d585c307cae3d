"""Calls to the brokers of a topic's groups. A group's queues are read from its master unless
the master just failed a call (unreachable, timed out); then from its slaves, until
``master_retry_ms`` has passed and the master is tried again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from tidemq._runtime import Channels, monotonic_ms
from tidemq.errors import BrokerUnavailableError, RequestTimeoutError, TidemqError, from_rpc_error
from tidemq.fault import FaultToleranceConfig, LatencyFaultTolerance
from tidemq.protos import broker_pb2_grpc
from tidemq.routes import BrokerGroup, MessageQueue, RouteCache

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0


class Brokers:
    """Where to read each queue, and the calls to get there; ``report`` hears every error a
    best-effort call swallows."""

    def __init__(
        self,
        channels: Channels,
        routes: RouteCache,
        master_retry_ms: int,
        report: Callable[[TidemqError], None],
    ) -> None:
        self._channels = channels
        self.routes = routes
        self._report = report
        # Brokers that just failed a call; reads go to another member of the group meanwhile.
        self._unreachable = LatencyFaultTolerance(
            FaultToleranceConfig(failure_isolation_ms=master_retry_ms)
        )

    async def call(self, address: str, method: str, request: Any) -> Any | None:
        """Best effort (heartbeats, leaving): a failure is logged, not raised."""
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            return await getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, address)
            self._report(err)
            log.debug("%s to %s failed: %s", method, address, err)
            return None

    def read_candidates(self, group: BrokerGroup) -> list[str]:
        """Where to read a group's queues, best first: the master unless it just failed, then
        the slaves by id (a slave that failed too goes last)."""
        now = monotonic_ms()
        ordered = [group.addresses[i] for i in sorted(group.addresses)]  # the master is id 0
        up = [a for a in ordered if self._unreachable.is_available(a, now)]
        return up + [a for a in ordered if a not in up]

    async def read_address(self, mq: MessageQueue) -> tuple[str, bool]:
        """The broker to read ``mq`` from, and whether it is the group's master."""
        route = await self.routes.get(mq.topic)
        group = route.groups.get(mq.broker_name)
        candidates = self.read_candidates(group) if group else []
        if not candidates:
            raise TidemqError(
                f"broker group {mq.broker_name} is not in the route of {mq.topic!r}",
                code="ROUTE_NOT_FOUND",
                retriable=True,
            )
        assert group is not None
        return candidates[0], candidates[0] == group.master

    async def invoke(
        self, mq: MessageQueue, address: str, method: str, request: Any, timeout_s: float
    ) -> Any:
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            response = await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, f"broker {mq.broker_name} at {address}")
            if isinstance(err, BrokerUnavailableError | RequestTimeoutError):
                self._unreachable.record_failure(address, monotonic_ms())
            raise err from None
        self._unreachable.record_success(address)
        return response

    async def broker_call(
        self, mq: MessageQueue, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S
    ) -> Any:
        """A call to the broker ``mq`` is read from; offsets are committed there too (a slave
        keeps them while its master is away, and config sync never lets the master's older
        ones replace them)."""
        address, _ = await self.read_address(mq)
        return await self.invoke(mq, address, method, request, timeout_s)
