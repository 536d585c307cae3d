"""Admission on the wire: a gRPC server interceptor that admits every unary call by its
connection (``context.peer()``, one per client channel) before its handler runs and holds its
place until the call is done, charges the connection's byte rate then (holding the connection
back when it is over), and the ways a call gives its place up early: a long poll while it is
parked, a send once its batch is stored. The decisions are ``admission``'s.

What a call costs: its request bytes, and for a pull the bytes its answer may carry (the
broker's cap on them included), since that is what it makes the broker build.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker.admission import (
    Admission,
    AdmissionLimits,
    ByteRateQuota,
    Verdict,
)
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.errors import ServiceError, abort_with
from tidemq.storage.clock import monotonic_ms

log = logging.getLogger(__name__)

PULL_METHOD = "/tidemq.v1.Broker/PullMessage"
REFUSAL_LOG_INTERVAL_MS = 10_000

Ticket = asyncio.Future[None]
# (method, request) -> (bytes it costs while it runs, bytes it holds while it waits)
Weigh = Callable[[str, Any], tuple[int, int]]


def request_cost(pull_cap_bytes: int) -> Weigh:
    """What a call costs (``Weigh``): its request bytes, and while it runs, for a pull, the
    answer it may get (a pull that names no max_bytes may get the whole cap)."""

    def weigh(method: str, request: Any) -> tuple[int, int]:
        if not isinstance(request, bytes):  # a service that decodes before its handler
            size: int = request.ByteSize()
            return size, size
        size = len(request)
        if method != PULL_METHOD:
            return size, size
        try:
            asked = broker_pb2.PullMessageRequest.FromString(request).max_bytes
        except DecodeError:
            return size, size  # the handler answers it INVALID_ARGUMENT
        return size + min(asked if asked > 0 else pull_cap_bytes, pull_cap_bytes), size

    return weigh


def _size(response: Any) -> int:
    if isinstance(response, bytes):
        return len(response)
    size: int = response.ByteSize()
    return size


class _Slot:
    """The place a call holds in its connection's admission, until the call is done."""

    def __init__(self, gate: AdmissionInterceptor, connection: str, cost: tuple[int, int]) -> None:
        self.gate = gate
        self.connection = connection
        self.cost_bytes, self.held_bytes = cost
        self.moved_bytes = self.held_bytes  # the request; the answer is added when known
        self.held = False


_current: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "tidemq_admission_slot", default=None
)


@contextlib.asynccontextmanager
async def stepped_aside() -> AsyncIterator[None]:
    """Around a wait that costs the broker nothing (a parked long poll): the call's connection
    may run other requests meanwhile; afterwards the call waits its turn again (it is never
    refused then: it was admitted once)."""
    slot = _current.get()
    if slot is None or not slot.held:
        yield
        return
    slot.gate.release(slot)
    yield  # a call that ends in the wait (cancelled, failed) does not come back for its turn
    await slot.gate.acquire(slot, may_refuse=False)


def work_done() -> None:
    """The call's costly part is over (a send stored its batch; what is left is waiting for
    the disk or the slaves): its connection may run other requests from here on."""
    slot = _current.get()
    if slot is not None and slot.held:
        slot.gate.release(slot)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Admits unary calls through ``admission``; streams (replication) pass untouched."""

    def __init__(
        self,
        admission: Admission[Ticket],
        weigh: Weigh,
        metrics: BrokerMetrics | None,
        quota: ByteRateQuota | None = None,
    ) -> None:
        self.admission = admission
        self.weigh = weigh
        self.quota = quota
        self.metrics = metrics
        self._refusals_logged_ms: int | None = None
        self._refused_at_log = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method: str = handler_call_details.method
        behavior = handler.unary_unary

        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            slot = _Slot(self, context.peer(), self.weigh(method, request))
            if self.quota is not None:
                self.quota.seen(slot.connection, monotonic_ms())
            if not await self.acquire(slot, may_refuse=True):
                await abort_with(context, self._busy(method, slot))
            # Held until the answer is on its way out, not only until the handler returns: a
            # pull's answer of megabytes is still the connection's while gRPC sends it.
            context.add_done_callback(lambda _context: self._done(slot))
            token = _current.set(slot)
            try:
                response = await behavior(request, context)
            finally:
                _current.reset(token)
            slot.moved_bytes += _size(response)
            return response

        return handler._replace(unary_unary=admitted)

    async def acquire(self, slot: _Slot, *, may_refuse: bool) -> bool:
        """Waits the slot's turn; False if refused."""
        ticket: Ticket = asyncio.get_running_loop().create_future()
        verdict = self.admission.arrive(
            slot.connection, ticket, slot.cost_bytes, slot.held_bytes, may_refuse=may_refuse
        )
        if verdict is Verdict.REFUSED:
            return False
        if verdict is Verdict.WAITING:
            try:
                await ticket
            except asyncio.CancelledError:
                # Admitted while the cancellation was on its way: it holds a place; give it up.
                if not self.admission.withdraw(slot.connection, ticket):
                    self._leave(slot)
                raise
        slot.held = True
        return True

    def release(self, slot: _Slot) -> None:
        if slot.held:
            slot.held = False
            self._leave(slot)

    def _done(self, slot: _Slot) -> None:
        """The call is over: its place goes back, and a connection over its byte rate is held
        back (its next calls wait) for as long as its quota says."""
        self.release(slot)
        if self.quota is None:
            return
        now = monotonic_ms()
        # Seen at the end too: a client starved for a while is still active.
        self.quota.seen(slot.connection, now)
        delay_ms = self.quota.charge(slot.connection, slot.moved_bytes, now)
        if delay_ms > 0:
            self.admission.hold(slot.connection)
            loop = asyncio.get_running_loop()
            loop.call_later(delay_ms / 1000, self._unhold, slot.connection)

    def _unhold(self, connection: str) -> None:
        self._wake(self.admission.leave(connection, 0))

    def _leave(self, slot: _Slot) -> None:
        self._wake(self.admission.leave(slot.connection, slot.cost_bytes))

    def _wake(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            if not ticket.done():  # a cancelled waiter withdraws itself
                ticket.set_result(None)

    def _busy(self, method: str, slot: _Slot) -> ServiceError:
        name = method.rpartition("/")[2]
        if self.metrics is not None:
            self.metrics.rpc(name, "BROKER_BUSY")
        self._log_refusals(slot.connection)
        lim = self.admission.limits
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            common_pb2.BROKER_BUSY,
            f"broker busy: this connection already has {lim.max_waiting_requests_per_connection}"
            f" requests or {lim.max_waiting_bytes_per_connection} bytes waiting, or the broker"
            f" {lim.max_concurrent_rpcs} requests; retry after a backoff",
            retriable=True,
        )

    def _log_refusals(self, connection: str) -> None:
        # Under a flood every request may be refused: one line per interval says so.
        now = monotonic_ms()
        last = self._refusals_logged_ms
        if last is None or now - last >= REFUSAL_LOG_INTERVAL_MS:
            refused = self.admission.refused
            log.warning(
                "broker busy: refused %d requests since the last report (latest from %s); "
                "%d requests running or waiting over %d connections",
                refused - self._refused_at_log,
                connection,
                self.admission.total,
                self.admission.connections,
            )
            self._refusals_logged_ms, self._refused_at_log = now, refused


def admission_interceptor(
    config: BrokerConfig, metrics: BrokerMetrics | None
) -> AdmissionInterceptor:
    """The broker's interceptor, with the limits of its config."""
    limits = AdmissionLimits(
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        max_inflight_requests_per_connection=config.max_inflight_requests_per_connection,
        max_inflight_bytes_per_connection=config.max_inflight_bytes_per_connection,
        max_waiting_requests_per_connection=config.max_waiting_requests_per_connection,
        max_waiting_bytes_per_connection=config.max_waiting_bytes_per_connection,
    )
    weigh = request_cost(config.max_pull_response_bytes)
    rate = config.max_bytes_per_second_per_connection
    quota = ByteRateQuota(rate) if rate else None
    return AdmissionInterceptor(Admission(limits), weigh, metrics, quota)
