"""A settle call the SDK had to retry: what its answer may and may not be read as.

The case behind the ack test, seen in test_receive_crash under load: a member's ack went out as
the broker was SIGKILLed and never reached its log; the restarted broker delivered the message
again once the handle expired, another member acked that delivery, and only then did the
member's retry arrive. MESSAGE_ALREADY_ACKED was the true answer to the retry, and counting it
as this ack's success told the member its ack completed a message that was delivered again.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from tidemq.consumer.receive_calls import ReceiveCalls, nacked_after_retry
from tidemq.errors import (
    BrokerUnavailableError,
    InvalidReceiptHandle,
    MessageAlreadyAcked,
    ReceiptHandleExpired,
)
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.unit

TOPIC, BROKER = "orders", "broker-a"
ACKED = common_pb2.ERROR_CODE_UNSPECIFIED  # no error: the handle's ack was taken


class _Routes:
    """The route of TOPIC: broker group BROKER with a master."""

    def __init__(self) -> None:
        self.invalidated = 0

    async def get(self, topic: str) -> Any:
        assert topic == TOPIC
        return SimpleNamespace(groups={BROKER: SimpleNamespace(master="127.0.0.1:1")})

    def invalidate(self, topic: str) -> None:
        self.invalidated += 1


def _calls(answers: list[Any]) -> tuple[ReceiveCalls, list[str]]:
    """Calls whose broker answers ``answers`` in turn (an exception is raised), and the list
    of methods it was called with."""
    calls = ReceiveCalls(
        "127.0.0.1:9",
        group="billing",
        subscriptions={TOPIC: "*"},
        client_id="member-1",
        start_from="first",
        request_timeout_ms=10_000,
        route_refresh_ms=30_000,
    )
    calls.routes = _Routes()  # type: ignore[assignment]
    made: list[str] = []

    async def call(address: str, method: str, request: Any, timeout_s: float) -> Any:
        made.append(method)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    calls._call = call  # type: ignore[method-assign]
    return calls, made


def _answer(*codes: int) -> broker_pb2.AckMessageResponse:
    r = broker_pb2.AckMessageResponse()
    for i, code in enumerate(codes):
        h = r.results.add(receipt_handle=f"h{i}")
        if code != ACKED:
            h.error.code = code
            h.error.message = "the broker's reason"
    return r


def _lost() -> BrokerUnavailableError:
    """The first attempt's fate is unknown: the broker died under it."""
    return BrokerUnavailableError("connection reset", code="UNAVAILABLE", retriable=True)


def test_a_retried_ack_that_finds_its_message_acked_is_not_reported_as_this_acks_success() -> None:
    calls, made = _calls([_lost(), _answer(common_pb2.MESSAGE_ALREADY_ACKED)])
    [result] = asyncio.run(calls.ack(TOPIC, BROKER, ["h0"]))
    assert made == ["AckMessage", "AckMessage"]  # it was retried
    assert isinstance(result, MessageAlreadyAcked), result


def test_a_retried_ack_the_broker_takes_is_acked_and_other_refusals_stay_errors() -> None:
    calls, _ = _calls([_lost(), _answer(ACKED, common_pb2.RECEIPT_HANDLE_EXPIRED)])
    ok, expired = asyncio.run(calls.ack(TOPIC, BROKER, ["h0", "h1"]))
    assert ok is None
    assert isinstance(expired, ReceiptHandleExpired)


def test_a_retried_nack_that_finds_its_handle_released_counts_as_nacked() -> None:
    acked, expired = MessageAlreadyAcked("acked"), ReceiptHandleExpired("expired")
    bad = InvalidReceiptHandle("forged")
    assert nacked_after_retry([expired, acked, bad, None]) == [None, acked, bad, None]
