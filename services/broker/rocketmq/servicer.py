"""``apache.rocketmq.v2.MessagingService`` as gRPC registers it: each RPC handed to the module
that owns its concern. Every answer carries a v2 ``Status``: a refusal or a failure is answered
in the body (never a bare gRPC error), as the official clients expect. The offset RPCs no
official client calls (PullMessage, UpdateOffset, GetOffset, QueryOffset) and the lite ones
answer gRPC's own UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tidemq.protos.rocketmq import definition_pb2, service_pb2, service_pb2_grpc
from tidemq.services.broker.groups import GroupSettings
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.rocketmq import routes
from tidemq.services.broker.rocketmq.clients import V2Clients, client_id_of
from tidemq.services.broker.rocketmq.sending import V2Sending
from tidemq.services.broker.rocketmq.settings import BrokerLimits
from tidemq.services.broker.rocketmq.status import StatusError, ok, status_of_exception
from tidemq.services.broker.rocketmq.telemetry import Telemetry
from tidemq.services.broker.rocketmq.transactions import V2Transactions
from tidemq.services.broker.servicer import BrokerServicer
from tidemq.services.errors import ServiceError
from tidemq.storage.clock import now_ms
from tidemq.storage.errors import StoreError

log = logging.getLogger(__name__)

# tidemq_rpc_requests_total's method label of a v2 call: "rocketmq.SendMessage", ...
METRIC_PREFIX = "rocketmq."

C = definition_pb2
Handler = Callable[..., Awaitable[Any]]


def answers_status(response: Callable[..., Any]) -> Callable[[Handler], Handler]:
    """A unary RPC whose every failure is answered as ``response(status=...)``, counted by the
    Code it answered."""

    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                answer = await fn(self, request, context)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as e:
                if not isinstance(e, ServiceError | StoreError | StatusError):
                    log.exception("v2 %s failed", fn.__name__)
                answer = response(status=status_of_exception(e))
            metrics: BrokerMetrics | None = self.metrics
            if metrics is not None:
                metrics.rpc(METRIC_PREFIX + fn.__name__, C.Code.Name(answer.status.code))
            return answer

        return wrapper

    return decorate


def _unimplemented(what: str) -> str:
    return (
        f"{what} is not served: no official RocketMQ client calls it (the Apache proxy does not "
        f"serve it either); consume with ReceiveMessage/AckMessage"
    )


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        broker: BrokerServicer,
        clients: V2Clients,
        route_source: routes.RouteSource,
        limits: BrokerLimits,
        group_settings: Callable[[str], GroupSettings | None],
    ) -> None:
        self.broker = broker
        self.metrics = broker.send.metrics
        self.clients = clients
        self.routes = route_source
        self.stopping = asyncio.Event()
        self.transactions = V2Transactions(broker.transactions, broker.delayed)
        self.telemetry = Telemetry(
            clients, limits, group_settings, self.stopping, self.transactions.watch_checks
        )
        self.sending = V2Sending(broker.send, limits.max_body_bytes)
        self.receiving = _receiving(broker, clients)

    def stop(self) -> None:
        """Shutdown: every Telemetry stream ends."""
        self.stopping.set()

    # ------------------------------------------------------------------ routes and clients
    @answers_status(service_pb2.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        client_id_of(context)
        routes.check_topic(request.topic.name)
        route = await self.routes.route(request.topic.name)
        queues = routes.message_queues(request.topic, route)
        if not queues:
            return service_pb2.QueryRouteResponse(
                status=definition_pb2.Status(
                    code=C.TOPIC_NOT_FOUND,
                    message=f"no broker serving the RocketMQ 5 protocol has topic "
                    f"{request.topic.name!r}",
                )
            )
        return service_pb2.QueryRouteResponse(status=ok(), message_queues=queues)

    @answers_status(service_pb2.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        client_id_of(context)
        routes.check_topic(request.topic.name)
        if not request.group.name:
            raise StatusError(C.ILLEGAL_CONSUMER_GROUP, "group.name is required")
        route = await self.routes.route(request.topic.name)
        return service_pb2.QueryAssignmentResponse(
            status=ok(), assignments=routes.assignments(request.topic, route)
        )

    @answers_status(service_pb2.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.clients.seen(client_id_of(context), now_ms())
        return service_pb2.HeartbeatResponse(status=ok())

    @answers_status(service_pb2.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.clients.remove(client_id_of(context))
        return service_pb2.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for command in self.telemetry.stream(request_iterator, context):
            yield command

    # ------------------------------------------------------------------ producing
    @answers_status(service_pb2.SendMessageResponse)
    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        client_id_of(context)
        return await self.sending.send_message(request, context)

    @answers_status(service_pb2.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        client_id_of(context)
        return await self.transactions.end(request, context)

    @answers_status(service_pb2.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        client_id_of(context)
        return await self.transactions.recall(request, context)

    # ------------------------------------------------------------------ consuming (receiving.py)
    async def ReceiveMessage(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        if self.receiving is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ReceiveMessage is not served yet")
        async for response in self.receiving.receive(request, context):
            yield response

    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.receiving is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "AckMessage is not served yet")
        return await self.receiving.ack(request, context)

    async def ChangeInvisibleDuration(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.receiving is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "ChangeInvisibleDuration is not served yet"
            )
        return await self.receiving.change_invisible_duration(request, context)

    async def ForwardMessageToDeadLetterQueue(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        if self.receiving is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "ForwardMessageToDeadLetterQueue is not served yet",
            )
        return await self.receiving.forward_to_dead_letter_queue(request, context)

    # ------------------------------------------------------------------ not served
    async def PullMessage(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _unimplemented("PullMessage"))
        yield  # an async generator, as gRPC tells a streaming handler by its function's kind

    async def UpdateOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _unimplemented("UpdateOffset"))

    async def GetOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _unimplemented("GetOffset"))

    async def QueryOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _unimplemented("QueryOffset"))

    async def SyncLiteSubscription(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "SyncLiteSubscription is not served: lite topics are not supported",
        )


def _receiving(broker: BrokerServicer, clients: V2Clients) -> Any:
    """Receive, ack, change and dead-letter (``receiving.py``), when this build has it."""
    try:
        receiving = importlib.import_module("tidemq.services.broker.rocketmq.receiving")
    except ModuleNotFoundError:
        return None
    return receiving.V2Receiving(broker, clients)
