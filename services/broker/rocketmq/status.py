"""The v2 ``Status`` every answer carries: OK, and our typed errors mapped to the ``Code`` an
official client acts on (retry elsewhere, "topic not found", "bad request", "too many requests",
"forbidden"). Pure."""

from __future__ import annotations

from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2
from tidemq.services.errors import ServiceError, to_service_error

C = definition_pb2
E = common_pb2

# Our ErrorCode -> v2 Code. Refusals that depend on the broker's state (not the master, store
# not writable, shutting down) are FORBIDDEN: a producer retries them on another broker group's
# queue at once, and a consumer's next receive goes to the next queue.
_CODES: dict[int, int] = {
    E.INVALID_ARGUMENT: C.BAD_REQUEST,
    E.INVALID_TOPIC: C.ILLEGAL_TOPIC,
    E.BODY_TOO_LARGE: C.MESSAGE_BODY_TOO_LARGE,
    E.PROPERTIES_SIZE_EXCEEDED: C.MESSAGE_PROPERTIES_TOO_LARGE,
    E.INVALID_PROPERTY: C.ILLEGAL_MESSAGE_PROPERTY_KEY,
    E.INVALID_QUEUE_ID: C.BAD_REQUEST,
    E.INVALID_MESSAGE_ID: C.ILLEGAL_MESSAGE_ID,
    E.INVALID_TAG_EXPRESSION: C.ILLEGAL_FILTER_EXPRESSION,
    E.INVALID_RECEIPT_HANDLE: C.INVALID_RECEIPT_HANDLE,
    E.TOPIC_NOT_FOUND: C.TOPIC_NOT_FOUND,
    E.TOPIC_EXISTS: C.BAD_REQUEST,
    E.GROUP_NOT_FOUND: C.CONSUMER_GROUP_NOT_FOUND,
    # Not MESSAGE_NOT_FOUND: clients read that one as "nothing to receive", a success.
    E.MESSAGE_NOT_FOUND: C.NOT_FOUND,
    E.ROUTE_NOT_FOUND: C.TOPIC_NOT_FOUND,
    E.NO_PERMISSION: C.FORBIDDEN,
    E.NOT_MASTER: C.FORBIDDEN,
    E.STORE_NOT_WRITABLE: C.FORBIDDEN,
    E.DISK_FULL: C.FORBIDDEN,
    E.SHUTTING_DOWN: C.FORBIDDEN,
    E.STALE_EPOCH: C.FORBIDDEN,
    E.BROKER_BUSY: C.TOO_MANY_REQUESTS,
    E.RECEIPT_HANDLE_EXPIRED: C.INVALID_RECEIPT_HANDLE,
    E.MESSAGE_ALREADY_ACKED: C.INVALID_RECEIPT_HANDLE,
    E.CONSUME_MODEL_MISMATCH: C.FORBIDDEN,
    E.CONSUME_DISABLED: C.FORBIDDEN,
    E.DELAY_TOO_LONG: C.ILLEGAL_DELIVERY_TIME,
    E.DELAYED_MESSAGE_NOT_FOUND: C.NOT_FOUND,
    E.TRANSACTION_NOT_FOUND: C.INVALID_TRANSACTION_ID,
    E.TRANSACTION_ALREADY_RESOLVED: C.PRECONDITION_FAILED,
    E.SEQUENCE_GAP: C.BAD_REQUEST,
    E.PRODUCER_FENCED: C.BAD_REQUEST,
    E.CORRUPT_RECORD: C.INTERNAL_ERROR,
    # A broker at its max_topics or max_groups: not a client's mistake, and no retry helps.
    E.LIMIT_EXCEEDED: C.PRECONDITION_FAILED,
    # Official clients retry a read that failed this way.
    E.ARCHIVE_UNAVAILABLE: C.PROXY_TIMEOUT,
    E.INTERNAL: C.INTERNAL_ERROR,
}

# A send that was stored but not made as durable as the broker promises in time.
_SEND_CODES: dict[int, int] = {
    broker_pb2.SEND_OK: C.OK,
    broker_pb2.FLUSH_DISK_TIMEOUT: C.MASTER_PERSISTENCE_TIMEOUT,
    broker_pb2.FLUSH_SLAVE_TIMEOUT: C.SLAVE_PERSISTENCE_TIMEOUT,
    broker_pb2.SLAVE_NOT_AVAILABLE: C.HA_NOT_AVAILABLE,
}


def ok(message: str = "OK") -> definition_pb2.Status:
    return definition_pb2.Status(code=C.OK, message=message)


def status(code: int, message: str) -> definition_pb2.Status:
    return definition_pb2.Status(code=code, message=message)


def code_of(our_code: int) -> int:
    """The v2 Code for one of our ErrorCodes (an unknown one is INTERNAL_ERROR)."""
    return int(_CODES.get(our_code, C.INTERNAL_ERROR))


def status_of(err: ServiceError) -> definition_pb2.Status:
    return definition_pb2.Status(code=code_of(err.code), message=str(err))


def status_of_exception(exc: BaseException) -> definition_pb2.Status:
    """Any exception a handler raised, as the v2 Status (via our typed wire form)."""
    if isinstance(exc, StatusError):
        return exc.status
    return status_of(to_service_error(exc))


def send_status(wire: int) -> definition_pb2.Status:
    """The Status of a stored send from its ``broker_pb2.SendStatus``."""
    code = _SEND_CODES.get(wire, C.INTERNAL_ERROR)
    if code == C.OK:
        return ok()
    return status(code, f"stored, but {broker_pb2.SendStatus.Name(wire)}")


class StatusError(Exception):
    """A refusal the v2 adapter answers as this Status (codes of the v2 protocol alone, such as
    CLIENT_ID_REQUIRED, that none of our ErrorCodes spell)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def status(self) -> definition_pb2.Status:
        return definition_pb2.Status(code=self.code, message=str(self))
