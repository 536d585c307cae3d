"""Consumption over the v2 protocol: ReceiveMessage, AckMessage, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue, carried out by the broker's own receive/ack handlers (so a
group keeps one in-flight state, one retry count and one dead-letter queue whichever protocol
its consumers use).

The handlers are called undecorated (``typed_errors`` would abort the call): every refusal
is answered in the body as a v2 ``Status`` (``status.py``). A receive answers a stream of one
``status`` (OK, or MESSAGE_NOT_FOUND when nothing came), then one ``message`` per message,
then the ``delivery_timestamp``, then it ends; it always ends before the call's deadline
(``receive_params.long_poll_ms``). It pops across all the topic's queues on this broker, as
RocketMQ's proxy does; the queue the client names only says which broker group.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2
from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.broker.handlers.receive import ReceiveHandlers
from tidemq.services.broker.rocketmq import receive_params as rules
from tidemq.services.broker.rocketmq.clients import V2Clients, client_id_of
from tidemq.services.broker.rocketmq.messages import received_to_v2
from tidemq.services.broker.rocketmq.renewal import AutoRenewal
from tidemq.services.broker.rocketmq.status import (
    StatusError,
    code_of,
    ok,
    status,
    status_of_exception,
)
from tidemq.services.broker.servicer import BrokerServicer
from tidemq.services.errors import ServiceError
from tidemq.storage.clock import now_ms
from tidemq.storage.errors import StoreError

log = logging.getLogger(__name__)

C = definition_pb2
TYPED = (StatusError, ServiceError, StoreError)

# The broker's own handlers without ``typed_errors``: they raise, and we answer in the body.
_receive = inspect.unwrap(ReceiveHandlers.ReceiveMessage)
_ack = inspect.unwrap(ReceiveHandlers.AckMessage)
_change = inspect.unwrap(ReceiveHandlers.ChangeInvisibleDuration)
_dead_letter = inspect.unwrap(ReceiveHandlers.DeadLetterMessage)


def _resource(r: Any, what: str, code: int) -> str:
    if not r.name:
        raise StatusError(code, f"{what} is required")
    return str(r.name)


class V2Receiving:
    def __init__(self, servicer: BrokerServicer, clients: V2Clients) -> None:
        self._servicer = servicer
        self.clients = clients
        self.renewal = AutoRenewal(
            self._renew, lambda cid: clients.get(cid) is not None, rules.AUTO_RENEW_INVISIBLE_MS
        )

    def _handlers(self) -> ReceiveHandlers:
        h = self._servicer.receive
        if h is None:
            raise StatusError(C.NOT_IMPLEMENTED, "this broker serves no receive/ack consumption")
        return h

    async def close(self) -> None:
        """Broker shutdown: auto-renewal stops."""
        await self.renewal.close()

    # ------------------------------------------------------------------ receive
    async def receive(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        try:
            handlers = self._handlers()
            req, client_id = self._our_receive(request, context, handlers)
            encoded = await _receive(handlers, req, context)
            answer = broker_pb2.ReceiveMessageResponse.FromString(encoded)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not isinstance(e, TYPED):  # typed errors are answers, not bugs
                log.exception("v2 ReceiveMessage failed")
            yield service_pb2.ReceiveMessageResponse(status=status_of_exception(e))
            return
        if not answer.messages:
            yield service_pb2.ReceiveMessageResponse(
                status=status(C.MESSAGE_NOT_FOUND, "no new message")
            )
            return
        if request.auto_renew:
            self.renewal.hold(
                client_id,
                req.group,
                req.topic,
                [(m.receipt_handle, m.invisible_until_ms) for m in answer.messages],
            )
        sent = 0
        try:
            yield service_pb2.ReceiveMessageResponse(status=ok())
            for m in answer.messages:
                yield service_pb2.ReceiveMessageResponse(message=received_to_v2(m))
                sent += 1
            at = timestamp_pb2.Timestamp()
            at.FromMilliseconds(now_ms())
            yield service_pb2.ReceiveMessageResponse(delivery_timestamp=at)
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away mid-stream: what it did not get comes back soon rather
            # than after its whole invisible time (as the proxy nacks with 1 s).
            unsent = [m.receipt_handle for m in answer.messages[sent:]]
            if unsent:
                asyncio.get_running_loop().create_task(self._release(req, unsent))
            raise

    def _our_receive(
        self, request: Any, context: grpc.aio.ServicerContext, handlers: ReceiveHandlers
    ) -> tuple[broker_pb2.ReceiveMessageRequest, str]:
        """The broker's ReceiveMessageRequest for a v2 one (after the v2 rules), and the
        client's id."""
        config = handlers.service.config
        group = _resource(request.group, "group", C.ILLEGAL_CONSUMER_GROUP)
        queue = request.message_queue
        topic = _resource(queue.topic, "message_queue.topic", C.ILLEGAL_TOPIC)
        if not rules.is_own_broker(queue.broker.name, config.broker_name):
            raise StatusError(
                C.BAD_REQUEST,
                f"this is broker group {config.broker_name!r}; the message queue names "
                f"{queue.broker.name!r} (query the route again)",
            )
        client_id = client_id_of(context)
        settings = self._client_settings(client_id)
        request_timeout_ms = (
            rules.duration_ms(settings.request_timeout)
            if settings is not None and settings.HasField("request_timeout")
            else None
        )
        remaining = context.time_remaining()
        poll_ms = rules.long_poll_ms(
            rules.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else None,
            None if remaining is None else int(remaining * 1000),
            request_timeout_ms,
        )
        invisible_ms = rules.receive_invisible_ms(
            rules.duration_ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else None,
            request.auto_renew,
            config.receive_min_invisible_ms,
            config.receive_max_invisible_ms,
        )
        req = broker_pb2.ReceiveMessageRequest(
            group=group,
            topic=topic,
            queue_id=-1,
            tag_expression=rules.tag_expression(
                request.filter_expression, request.HasField("filter_expression")
            ),
            max_messages=min(rules.batch_size(request.batch_size), config.max_receive_messages),
            invisible_duration_ms=invisible_ms,
            long_poll_timeout_ms=poll_ms,
            client_id=client_id,
        )
        return req, client_id

    def _client_settings(self, client_id: str) -> Any:
        client = self.clients.get(client_id)
        return client.settings if client is not None else None

    async def _release(self, req: broker_pb2.ReceiveMessageRequest, handles: list[str]) -> None:
        handlers = self._handlers()
        floor_ms = handlers.service.config.receive_min_invisible_ms
        for h in handles:
            self.renewal.forget(h)
            # Best effort: a handle that cannot be changed comes back after its invisible time.
            with contextlib.suppress(Exception):
                await service_change(handlers, req.group, req.topic, h, floor_ms)

    # ------------------------------------------------------------------ settling
    async def ack(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> service_pb2.AckMessageResponse:
        out = service_pb2.AckMessageResponse()
        try:
            client_id_of(context)
            handlers = self._handlers()
            group = _resource(request.group, "group", C.ILLEGAL_CONSUMER_GROUP)
            topic = _resource(request.topic, "topic", C.ILLEGAL_TOPIC)
            entries = list(request.entries)
            if not entries:
                raise StatusError(C.BAD_REQUEST, "at least one entry is required")
            handles = [await self.renewal.current(e.receipt_handle) for e in entries]
            answer = await _ack(
                handlers,
                broker_pb2.AckMessageRequest(group=group, topic=topic, receipt_handles=handles),
                context,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not isinstance(e, TYPED):  # typed errors are answers, not bugs
                log.exception("v2 AckMessage failed")
            out.status.CopyFrom(status_of_exception(e))
            return out
        codes = []
        for entry, result in zip(entries, answer.results, strict=True):
            if result.HasField("error"):
                st = status(code_of(result.error.code), result.error.message)
            else:
                st = ok()
                self.renewal.forget(entry.receipt_handle)
            codes.append(st.code)
            out.entries.add(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
            )
        top = rules.ack_status_code(codes)
        if top == C.OK:
            out.status.CopyFrom(ok())
        elif top == C.MULTIPLE_RESULTS:
            done = codes.count(C.OK)
            out.status.CopyFrom(status(top, f"{done} of {len(codes)} acked; see each entry"))
        else:
            out.status.CopyFrom(out.entries[0].status)
        return out

    async def change_invisible_duration(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> service_pb2.ChangeInvisibleDurationResponse:
        # The client takes the answer's handle before it looks at the status: on a refusal it
        # gets its own back, so its next ack is refused for what it is, not for an empty one.
        out = service_pb2.ChangeInvisibleDurationResponse(receipt_handle=request.receipt_handle)
        try:
            client_id_of(context)
            handlers = self._handlers()
            config = handlers.service.config
            group = _resource(request.group, "group", C.ILLEGAL_CONSUMER_GROUP)
            topic = _resource(request.topic, "topic", C.ILLEGAL_TOPIC)
            if not request.receipt_handle:
                raise StatusError(C.INVALID_RECEIPT_HANDLE, "receipt_handle is required")
            ms = rules.change_invisible_ms(
                rules.duration_ms(request.invisible_duration),
                config.receive_min_invisible_ms,
                config.receive_max_invisible_ms,
            )
            handle = await self.renewal.current(request.receipt_handle)
            new = await service_change(handlers, group, topic, handle, ms)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not isinstance(e, TYPED):  # typed errors are answers, not bugs
                log.exception("v2 ChangeInvisibleDuration failed")
            out.status.CopyFrom(status_of_exception(e))
            return out
        # The client decides from now on (a push consumer's nack): no more renewal.
        self.renewal.forget(request.receipt_handle)
        out.receipt_handle = new
        out.status.CopyFrom(ok())
        return out

    async def forward_to_dead_letter_queue(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        out = service_pb2.ForwardMessageToDeadLetterQueueResponse()
        try:
            client_id_of(context)
            handlers = self._handlers()
            group = _resource(request.group, "group", C.ILLEGAL_CONSUMER_GROUP)
            topic = _resource(request.topic, "topic", C.ILLEGAL_TOPIC)
            if not request.receipt_handle:
                raise StatusError(C.INVALID_RECEIPT_HANDLE, "receipt_handle is required")
            handle = await self.renewal.current(request.receipt_handle)
            reason = (
                f"forwarded by the consumer after {request.delivery_attempt} of "
                f"{request.max_delivery_attempts} delivery attempts"
            )
            await _dead_letter(
                handlers,
                broker_pb2.DeadLetterMessageRequest(
                    group=group, topic=topic, receipt_handle=handle, reason=reason
                ),
                context,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not isinstance(e, TYPED):  # typed errors are answers, not bugs
                log.exception("v2 ForwardMessageToDeadLetterQueue failed")
            out.status.CopyFrom(status_of_exception(e))
            return out
        self.renewal.forget(request.receipt_handle)
        out.status.CopyFrom(ok())
        return out

    async def _renew(self, group: str, topic: str, handle: str, ms: int) -> tuple[str, int]:
        handlers = self._handlers()
        config = handlers.service.config
        ms = min(max(ms, config.receive_min_invisible_ms), config.receive_max_invisible_ms)
        new, until = await handlers.settle.change_invisible_duration(group, topic, handle, ms)
        return new, until


async def service_change(
    handlers: ReceiveHandlers, group: str, topic: str, handle: str, ms: int
) -> str:
    """ChangeInvisibleDuration through the broker's own handler; the new handle."""
    answer = await _change(
        handlers,
        broker_pb2.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, invisible_duration_ms=ms
        ),
        None,
    )
    return str(answer.receipt_handle)
