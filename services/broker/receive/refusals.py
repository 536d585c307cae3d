"""Why a receipt handle is refused, as the typed error a client maps back to an exception
(``InvalidReceiptHandle``, ``ReceiptHandleExpired``, ``MessageAlreadyAcked``). Pure.

The state machine says what became of a handle's delivery (``HandleStatus``); this says it to
the consumer: what happened and what to do. None of these is retriable: the same handle fails
the same way, and an unacked message comes back by receiving again.
"""

from __future__ import annotations

from tidemq.services.broker.receive.handle import InvalidHandle, ReceiptHandle
from tidemq.services.broker.receive.queue_state import HandleStatus
from tidemq.services.errors import ServiceError, already_acked, handle_expired, invalid_handle


def parse_handle(text: str) -> ReceiptHandle:
    """The handle ``text`` stands for; INVALID_RECEIPT_HANDLE when it is none this broker
    issued (damaged, forged, truncated, too long)."""
    try:
        return ReceiptHandle.decode(text)
    except InvalidHandle as e:
        raise invalid_handle(f"not a receipt handle: {e}") from None


def handle_refusal(status: HandleStatus, handle: ReceiptHandle) -> ServiceError | None:
    """The error for a handle whose delivery check said ``status``; None when it is OK."""
    where = f"message {handle.topic}/{handle.queue_id}@{handle.offset} of group {handle.group!r}"
    if status is HandleStatus.OK:
        return None
    if status is HandleStatus.EXPIRED:
        return handle_expired(
            f"the receipt handle of {where} expired (its invisible time ended at "
            f"{handle.invisible_until_ms} ms): the message is delivered again, receive it"
        )
    if status is HandleStatus.SUPERSEDED:
        return handle_expired(
            f"the receipt handle of {where} was replaced (the invisible time was changed, the "
            f"message nacked or delivered again): use the newest handle, or receive it again"
        )
    if status is HandleStatus.ACKED:
        return already_acked(f"{where} was acked already (or dead-lettered)")
    return invalid_handle(f"no delivery of {where} under this receipt handle is known")


def handle_mismatch(
    handle: ReceiptHandle, broker_name: str, group: str, topic: str
) -> ServiceError | None:
    """INVALID_RECEIPT_HANDLE when ``handle`` was issued for another broker group, consumer
    group or topic than the call it came with names; None when it matches."""
    for what, theirs, ours in (
        ("broker group", handle.broker_name, broker_name),
        ("consumer group", handle.group, group),
        ("topic", handle.topic, topic),
    ):
        if theirs != ours:
            return invalid_handle(f"the receipt handle is of {what} {theirs!r}, not {ours!r}")
    return None
