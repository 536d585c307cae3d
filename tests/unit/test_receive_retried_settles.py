"""A settle call the SDK had to retry: what the first, unanswered attempt did stands."""

from __future__ import annotations

from tidemq.consumer.receive_calls import settled_after_retry
from tidemq.errors import InvalidReceiptHandle, MessageAlreadyAcked, ReceiptHandleExpired


def test_a_retried_ack_that_finds_its_message_acked_counts_as_acked() -> None:
    acked, expired = MessageAlreadyAcked("acked"), ReceiptHandleExpired("expired")
    assert settled_after_retry([None, acked, expired], ack=True) == [None, None, expired]


def test_a_retried_nack_that_finds_its_handle_released_counts_as_nacked() -> None:
    acked, expired = MessageAlreadyAcked("acked"), ReceiptHandleExpired("expired")
    bad = InvalidReceiptHandle("forged")
    assert settled_after_retry([expired, acked, bad, None], ack=False) == [None, acked, bad, None]
