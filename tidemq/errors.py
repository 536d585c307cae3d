"""Exceptions of the SDK: one class per kind of failure, each carrying ``retriable``.

Brokers and nameservers answer a failed call with a gRPC status plus an ``ErrorDetail`` trailer
(``protos/errors.py``); ``from_rpc_error`` maps the detail's code to a class here. A status
without a detail (the server is gone, a proxy answered) is classified by its gRPC code alone:
UNAVAILABLE and DEADLINE_EXCEEDED are retriable, anything else is not.

Catch ``TidemqError`` for everything, or a subclass for one case::

    try:
        producer.send("orders", b"...")
    except tidemq.errors.TopicNotFoundError:
        ...
"""

from __future__ import annotations

from typing import Any

import grpc

from tidemq.protos import common_pb2
from tidemq.protos.errors import detail_from_metadata


class TidemqError(Exception):
    """Base class. ``code`` is the wire ErrorCode name (e.g. ``"TOPIC_NOT_FOUND"``)."""

    default_retriable = False

    def __init__(
        self,
        message: str,
        *,
        code: str = "INTERNAL",
        retriable: bool | None = None,
        status: grpc.StatusCode | None = None,
        min_offset: int = 0,
        max_offset: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = self.default_retriable if retriable is None else retriable
        self.status = status
        self.min_offset = min_offset
        self.max_offset = max_offset

    def __str__(self) -> str:
        return f"{self.code}: {self.args[0]}"


class InvalidArgumentError(TidemqError):
    """The request is wrong (bad topic name, oversize body, ...): retrying cannot help."""


class NotFoundError(TidemqError):
    """Something named in the request does not exist."""


class TopicNotFoundError(NotFoundError):
    pass


class RouteNotFoundError(NotFoundError):
    """No broker group serves the topic (nameservers know nothing of it)."""


class MessageNotFoundError(NotFoundError):
    pass


class PermissionDeniedError(TidemqError):
    """The topic is not writable (or readable) on that broker, or the account's permissions
    do not allow the call (code ``ACCESS_DENIED``)."""


class AuthenticationError(TidemqError):
    """The server does not know who is asking: no credentials, an unknown access key, a wrong
    secret key, or a clock too far from the server's (docs/security.md)."""


class BrokerUnavailableError(TidemqError):
    """The broker cannot serve right now (down, shutting down, not master, busy)."""

    default_retriable = True


class DiskFullError(BrokerUnavailableError):
    pass


class StaleEpochError(BrokerUnavailableError):
    """The broker's role changed under the caller (failover); refresh routes and retry."""


class CorruptDataError(TidemqError):
    """The broker found damaged data while serving; an operator must look."""


class DataLossError(TidemqError):
    """Messages a reader asked for are gone: retention deleted them, or a broker lost its tail."""


class RequestTimeoutError(TidemqError):
    """No answer within the deadline. The request may or may not have taken effect."""

    default_retriable = True


class ClientClosedError(TidemqError):
    """The producer, consumer or admin client was closed."""


class InvalidReceiptHandle(InvalidArgumentError):
    """The receipt handle is not one the broker gave out for this group and topic: damaged,
    forged, or another group's or topic's."""


class ReceiptHandleExpired(TidemqError):
    """The handle's delivery is over: its invisible time ended, or the message was nacked,
    dead-lettered or given a new handle since. Receive the message again."""


class MessageAlreadyAcked(TidemqError):
    """The message of this handle was acknowledged already."""


class ConsumeModelMismatch(TidemqError):
    """The group consumes by offsets and this is a receive/ack call, or the reverse. An
    operator changes a group's model (``tidemq consumer-group update --model``)."""


class ConsumeDisabled(TidemqError):
    """An operator disabled consumption for the group."""


class DelayTooLong(InvalidArgumentError):
    """A delivery time further ahead than the broker's ``max_delay_ms``."""


class DelayedMessageNotFound(NotFoundError):
    """The delayed message is not pending: delivered already, recalled, or never sent here."""


class TransactionNotFound(NotFoundError):
    """The broker does not know this transaction (never begun on it, or long gone)."""


class TransactionAlreadyResolved(TidemqError):
    """The transaction was committed or rolled back already (by the producer or the checker)."""


class SequenceGap(TidemqError):
    """An idempotent send arrived before an earlier send of its producer and queue; retriable
    while that earlier send may still arrive."""


class ProducerFenced(TidemqError):
    """Another producer with the same producer id and a newer epoch took over."""


class LimitExceededError(TidemqError):
    """The broker holds as many topics or consumer groups as its settings allow
    (``max_topics``, ``max_groups``); the message names the setting. Not retriable: the same
    call fails until something is deleted or the limit raised."""


_BY_CODE: dict[int, type[TidemqError]] = {
    common_pb2.INVALID_ARGUMENT: InvalidArgumentError,
    common_pb2.INVALID_TOPIC: InvalidArgumentError,
    common_pb2.BODY_TOO_LARGE: InvalidArgumentError,
    common_pb2.PROPERTIES_SIZE_EXCEEDED: InvalidArgumentError,
    common_pb2.INVALID_PROPERTY: InvalidArgumentError,
    common_pb2.INVALID_QUEUE_ID: InvalidArgumentError,
    common_pb2.INVALID_MESSAGE_ID: InvalidArgumentError,
    common_pb2.INVALID_TAG_EXPRESSION: InvalidArgumentError,
    common_pb2.INVALID_RECEIPT_HANDLE: InvalidReceiptHandle,
    common_pb2.CORRUPT_BLOCK: InvalidArgumentError,
    common_pb2.TOPIC_NOT_FOUND: TopicNotFoundError,
    common_pb2.TOPIC_EXISTS: InvalidArgumentError,
    common_pb2.GROUP_NOT_FOUND: NotFoundError,
    common_pb2.MESSAGE_NOT_FOUND: MessageNotFoundError,
    common_pb2.ROUTE_NOT_FOUND: RouteNotFoundError,
    common_pb2.NO_PERMISSION: PermissionDeniedError,
    common_pb2.NOT_MASTER: BrokerUnavailableError,
    common_pb2.STORE_NOT_WRITABLE: BrokerUnavailableError,
    common_pb2.DISK_FULL: DiskFullError,
    common_pb2.SHUTTING_DOWN: BrokerUnavailableError,
    common_pb2.BROKER_BUSY: BrokerUnavailableError,
    common_pb2.STALE_EPOCH: StaleEpochError,
    common_pb2.CORRUPT_RECORD: CorruptDataError,
    common_pb2.RECEIPT_HANDLE_EXPIRED: ReceiptHandleExpired,
    common_pb2.MESSAGE_ALREADY_ACKED: MessageAlreadyAcked,
    common_pb2.CONSUME_MODEL_MISMATCH: ConsumeModelMismatch,
    common_pb2.CONSUME_DISABLED: ConsumeDisabled,
    common_pb2.DELAY_TOO_LONG: DelayTooLong,
    common_pb2.DELAYED_MESSAGE_NOT_FOUND: DelayedMessageNotFound,
    common_pb2.TRANSACTION_NOT_FOUND: TransactionNotFound,
    common_pb2.TRANSACTION_ALREADY_RESOLVED: TransactionAlreadyResolved,
    common_pb2.SEQUENCE_GAP: SequenceGap,
    common_pb2.PRODUCER_FENCED: ProducerFenced,
    common_pb2.LIMIT_EXCEEDED: LimitExceededError,
    common_pb2.UNAUTHENTICATED: AuthenticationError,
    common_pb2.ACCESS_DENIED: PermissionDeniedError,
}

_BY_STATUS: dict[grpc.StatusCode, type[TidemqError]] = {
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: RequestTimeoutError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.CANCELLED: ClientClosedError,
}


def from_rpc_error(error: grpc.RpcError, target: str = "") -> TidemqError:
    """The typed exception for a failed call (``target`` names the server, for the message)."""
    status: grpc.StatusCode = error.code()
    details: str = error.details() or status.name
    detail: Any = detail_from_metadata(error.trailing_metadata())
    if detail is not None and detail.code:
        return from_detail(detail, target, status=status, fallback_message=details)
    where = f" ({target})" if target else ""
    cls = _BY_STATUS.get(status, TidemqError)
    return cls(f"{details}{where}", code=status.name, status=status)


def from_detail(
    detail: Any,
    target: str = "",
    *,
    status: grpc.StatusCode | None = None,
    fallback_message: str = "",
) -> TidemqError:
    """The typed exception for an ``ErrorDetail``: a failed call's trailer, or one handle's
    result in a batch answer (AckMessage, NackMessage)."""
    where = f" ({target})" if target else ""
    cls = _BY_CODE.get(detail.code, TidemqError)
    try:
        code = common_pb2.ErrorCode.Name(detail.code)
    except ValueError:  # a newer server's code: keep the number
        code = str(detail.code)
    return cls(
        f"{detail.message or fallback_message or code}{where}",
        code=code,
        retriable=detail.retriable,
        status=status,
        min_offset=detail.min_offset,
        max_offset=detail.max_offset,
    )


def is_retriable(error: BaseException) -> bool:
    return isinstance(error, TidemqError) and error.retriable
