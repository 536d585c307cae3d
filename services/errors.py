"""Typed errors on the wire: one table from our exceptions to (gRPC status, ErrorCode, retriable),
and the helper every servicer uses to fail a call with them.

A servicer never lets an exception escape as an opaque UNKNOWN: it raises ``ServiceError`` (or a
storage error) and ``abort_with`` turns it into a status plus the ``ErrorDetail`` trailer that the
SDK maps back to an exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import error_metadata
from tidemq.storage import errors as store_errors
from tidemq.storage.archive.format import ArchiveCorruptError, ArchiveUnavailableError
from tidemq.storage.record.block import CorruptBlockError

E = common_pb2


@dataclass(frozen=True)
class Wire:
    status: grpc.StatusCode
    code: int  # common_pb2.ErrorCode value
    retriable: bool


class ServiceError(Exception):
    """An error a servicer answers on purpose, with its wire form."""

    def __init__(
        self,
        status: grpc.StatusCode,
        code: int,
        message: str,
        *,
        retriable: bool = False,
        min_offset: int = 0,
        max_offset: int = 0,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retriable = retriable
        self.min_offset = min_offset
        self.max_offset = max_offset


def invalid(message: str, code: int = E.INVALID_ARGUMENT) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, code, message)


def not_found(message: str, code: int) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, code, message)


# ---------------------------------------------------------------- receive/ack consumption
# A receive group's refusals. None is retriable: the same call would fail the same way (a handle
# that expired stays expired; the message comes again by receiving it).

# How an error names a consume model: what it is, and the clients that use it.
MODEL_NAMES = {
    broker_pb2.OFFSETS: "offsets (model OFFSETS: pull and commit, Consumer and QueueReader)",
    broker_pb2.RECEIVE: "receive/ack (model RECEIVE: SimpleConsumer and PushConsumer)",
}
# The CLI's spelling of each model (`tidemq consumer-group update GROUP --model ...`).
MODEL_FLAGS = {broker_pb2.OFFSETS: "offsets", broker_pb2.RECEIVE: "receive"}


def model_mismatch(group: str, has: int, wants: int) -> ServiceError:
    """A call of one consume model on a group that uses the other (FAILED_PRECONDITION)."""
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        E.CONSUME_MODEL_MISMATCH,
        f"consumer group {group!r} consumes by {MODEL_NAMES.get(has, has)}; this call consumes"
        f" by {MODEL_NAMES.get(wants, wants)}: use another group for it, or change the group's"
        f" model with `tidemq consumer-group update {group} --model"
        f" {MODEL_FLAGS.get(wants, wants)}`",
    )


def consume_disabled(group: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        E.CONSUME_DISABLED,
        f"consumption is disabled for consumer group {group!r}: an operator enables it with"
        f" `tidemq consumer-group update {group} --consume-enabled true`",
    )


def invalid_handle(message: str) -> ServiceError:
    """Unparsable, forged, or another group's, topic's or broker group's receipt handle."""
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_RECEIPT_HANDLE, message)


def handle_expired(message: str) -> ServiceError:
    """The handle's delivery is over (invisible time ended, nacked, dead-lettered, replaced)."""
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, E.RECEIPT_HANDLE_EXPIRED, message)


def already_acked(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, E.MESSAGE_ALREADY_ACKED, message)


def system_topic(topic: str, what: str = "send to") -> ServiceError:
    """A client naming a topic only the broker writes (%SYS%..., %DLQ%...)."""
    why = (
        "a dead-letter queue, which only the broker writes (`tidemq dlq resend` sends a dead "
        "letter back to its own topic)"
        if topic.startswith("%DLQ%")
        else "the broker's own log"
    )
    return invalid(f"cannot {what} {topic!r}: a system topic, {why}", E.INVALID_TOPIC)


def group_not_found(group: str) -> ServiceError:
    return not_found(f"consumer group {group!r} does not exist on this broker", E.GROUP_NOT_FOUND)


# Storage error class -> wire form. Subclasses come before their bases: the first match wins.
_STORE: list[tuple[type[store_errors.StoreError], Wire]] = [
    (
        store_errors.BodyTooLargeError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.BODY_TOO_LARGE, False),
    ),
    (
        store_errors.InvalidTopicError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_TOPIC, False),
    ),
    (
        store_errors.PropertiesTooLargeError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.PROPERTIES_SIZE_EXCEEDED, False),
    ),
    (
        store_errors.InvalidPropertyError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_PROPERTY, False),
    ),
    (
        store_errors.InvalidQueueIdError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_QUEUE_ID, False),
    ),
    (CorruptBlockError, Wire(grpc.StatusCode.INVALID_ARGUMENT, E.CORRUPT_BLOCK, False)),
    (
        store_errors.MessageIllegalError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_ARGUMENT, False),
    ),
    (
        store_errors.InvalidMessageIdError,
        Wire(grpc.StatusCode.INVALID_ARGUMENT, E.INVALID_MESSAGE_ID, False),
    ),
    (
        store_errors.MessageNotFoundError,
        Wire(grpc.StatusCode.NOT_FOUND, E.MESSAGE_NOT_FOUND, False),
    ),
    (store_errors.DiskFullError, Wire(grpc.StatusCode.RESOURCE_EXHAUSTED, E.DISK_FULL, True)),
    (
        store_errors.StoreNotWritableError,
        Wire(grpc.StatusCode.UNAVAILABLE, E.STORE_NOT_WRITABLE, True),
    ),
    (store_errors.StoreClosedError, Wire(grpc.StatusCode.UNAVAILABLE, E.SHUTTING_DOWN, True)),
    (store_errors.CorruptRecordError, Wire(grpc.StatusCode.DATA_LOSS, E.CORRUPT_RECORD, False)),
    # An archived object that fails its checksum is never served (docs/archive.md).
    (ArchiveCorruptError, Wire(grpc.StatusCode.DATA_LOSS, E.CORRUPT_RECORD, False)),
    (ArchiveUnavailableError, Wire(grpc.StatusCode.UNAVAILABLE, E.ARCHIVE_UNAVAILABLE, True)),
    (store_errors.CorruptStoreError, Wire(grpc.StatusCode.DATA_LOSS, E.CORRUPT_RECORD, False)),
    (
        store_errors.OffsetBelowMinError,
        Wire(grpc.StatusCode.OUT_OF_RANGE, E.INVALID_ARGUMENT, False),
    ),
    (
        store_errors.OffsetBeyondMaxError,
        Wire(grpc.StatusCode.OUT_OF_RANGE, E.INVALID_ARGUMENT, False),
    ),
]


def to_service_error(exc: BaseException) -> ServiceError:
    """The wire form of any exception; unknown ones are INTERNAL (and a bug to fix)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, store_errors.StoreError):
        for cls, wire in _STORE:
            if isinstance(exc, cls):
                lo = getattr(exc, "min_offset", 0)
                hi = getattr(exc, "max_offset", 0)
                return ServiceError(
                    wire.status,
                    wire.code,
                    str(exc),
                    retriable=wire.retriable,
                    min_offset=lo,
                    max_offset=hi,
                )
        return ServiceError(grpc.StatusCode.INTERNAL, E.INTERNAL, str(exc), retriable=exc.retriable)
    return ServiceError(grpc.StatusCode.INTERNAL, E.INTERNAL, f"{type(exc).__name__}: {exc}")


def detail_of(err: ServiceError) -> common_pb2.ErrorDetail:
    return common_pb2.ErrorDetail(
        code=err.code,
        message=str(err),
        retriable=err.retriable,
        min_offset=err.min_offset,
        max_offset=err.max_offset,
    )


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Fail the call with the typed wire form of ``exc``."""
    err = to_service_error(exc)
    context.set_trailing_metadata(error_metadata(detail_of(err)))
    await context.abort(err.status, str(err))
    raise AssertionError("unreachable: context.abort raises")


class Admitter(Protocol):
    """Decides whether a call may run (``tidemq.services.auth.on_the_wire.WireGuard``): returns,
    or aborts the call."""

    async def admit(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """``request`` is the decoded request, None at the start of a bidirectional stream."""


def add_servicer(
    add: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    guard: Admitter | None = None,
) -> None:
    """Register ``servicer`` with a generated ``add_*Servicer_to_server`` function, but decode
    each request inside the handler, and with ``guard`` admit each call (docs/security.md)
    before its handler runs.

    gRPC itself answers bytes it cannot decode (corrupt wire format, a string that is not UTF-8)
    with an opaque UNKNOWN and logs a traceback; here they get INVALID_ARGUMENT and the typed
    ErrorDetail, like any other bad input."""
    capture = _HandlerCapture()
    add(servicer, capture)
    handlers = {
        name: _decode_in_handler(h, f"/{capture.service}/{name}", guard)
        for name, h in capture.handlers.items()
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.service, handlers),)
    )
    server.add_registered_method_handlers(capture.service, handlers)


class _HandlerCapture:
    """Stands in for a server to receive what a generated ``add_*`` function registers."""

    service = ""
    handlers: dict[str, Any]

    def add_generic_rpc_handlers(self, _handlers: object) -> None:
        pass  # the same handlers arrive in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


def _decode_in_handler(handler: Any, method: str, guard: Admitter | None) -> Any:
    decode = handler.request_deserializer
    encode = handler.response_serializer
    behavior = handler.unary_unary
    if decode is None or encode is None:
        return handler
    if behavior is None:
        if handler.unary_stream is not None:
            return _decode_in_stream_handler(handler, method, guard)
        if handler.stream_stream is not None:
            return _decode_in_bidi_handler(handler, method, guard)
        return handler

    encode_unless_encoded = _encode_unless_encoded(encode)

    async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = decode(raw)
        except DecodeError as e:
            await abort_with(context, invalid(f"the request is not a valid message: {e}"))
        if guard is not None:
            await guard.admit(method, request, context)
        return await behavior(request, context)

    return handler._replace(
        request_deserializer=None,
        response_serializer=encode_unless_encoded,
        unary_unary=unary_unary,
    )


def _decode_in_stream_handler(handler: Any, method: str, guard: Admitter | None) -> Any:
    """A server-streaming call (a producer's transaction checks): the same typed answer to a
    request that does not decode."""
    decode = handler.request_deserializer
    behavior = handler.unary_stream

    async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            request = decode(raw)
        except DecodeError as e:
            await abort_with(context, invalid(f"the request is not a valid message: {e}"))
        if guard is not None:
            await guard.admit(method, request, context)
        async for response in behavior(request, context):
            yield response

    return handler._replace(request_deserializer=None, unary_stream=unary_stream)


def _encode_unless_encoded(encode: Any) -> Any:
    def encoded(response: Any) -> bytes:
        # A handler may answer bytes it encoded itself (a pull encodes its answer in slices, a
        # master its replication chunks).
        return response if isinstance(response, bytes) else encode(response)

    return encoded


def _decode_in_bidi_handler(handler: Any, method: str, guard: Admitter | None) -> Any:
    """A bidirectional stream (RocketMQ 5's Telemetry): each inbound message is decoded as the
    handler reads it; one that does not decode raises ``ServiceError(INVALID_ARGUMENT)`` there,
    for the handler to answer (gRPC would end the call with an opaque error)."""
    decode = handler.request_deserializer
    behavior = handler.stream_stream

    async def decoded(raw_requests: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        async for raw in raw_requests:
            try:
                yield decode(raw)
            except DecodeError as e:
                raise invalid(f"a stream message is not a valid message: {e}") from None

    async def stream_stream(
        raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        if guard is not None:
            await guard.admit(method, None, context)
        async for response in behavior(decoded(raw_requests), context):
            yield response

    return handler._replace(
        request_deserializer=None,
        response_serializer=_encode_unless_encoded(handler.response_serializer),
        stream_stream=stream_stream,
    )
