"""What a consumer is told when its receipt handle is refused: the wire code the SDK maps to
its exception, never retriable, and words that say what happened to the delivery."""

from __future__ import annotations

import grpc
import pytest

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker.receive.handle import ReceiptHandle
from tidemq.services.broker.receive.queue_state import HandleStatus
from tidemq.services.broker.receive.refusals import handle_mismatch, handle_refusal, parse_handle
from tidemq.services.errors import ServiceError, consume_disabled, detail_of, model_mismatch

HANDLE = ReceiptHandle("broker-a", "billing", "orders", 3, 41, 9_000, 1_700_000_030_000)
E = common_pb2
FAILED, INVALID = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("status", "wire", "code", "words"),
    [
        (HandleStatus.EXPIRED, FAILED, E.RECEIPT_HANDLE_EXPIRED, "expired"),
        (HandleStatus.SUPERSEDED, FAILED, E.RECEIPT_HANDLE_EXPIRED, "was replaced"),
        (HandleStatus.ACKED, FAILED, E.MESSAGE_ALREADY_ACKED, "acked already"),
        (HandleStatus.UNKNOWN, INVALID, E.INVALID_RECEIPT_HANDLE, "no delivery"),
    ],
)
def test_each_refused_delivery_has_its_code(
    status: HandleStatus, wire: grpc.StatusCode, code: int, words: str
) -> None:
    err = handle_refusal(status, HANDLE)
    assert err is not None
    detail = detail_of(err)
    assert (err.status, detail.code, detail.retriable) == (wire, code, False)
    assert words in detail.message and "orders/3@41" in detail.message


def test_a_valid_delivery_is_not_refused() -> None:
    assert handle_refusal(HandleStatus.OK, HANDLE) is None


def test_a_handle_of_another_group_topic_or_broker_is_invalid() -> None:
    assert handle_mismatch(HANDLE, "broker-a", "billing", "orders") is None
    for args, says in (
        (("broker-b", "billing", "orders"), "broker group 'broker-a', not 'broker-b'"),
        (("broker-a", "shipping", "orders"), "consumer group 'billing', not 'shipping'"),
        (("broker-a", "billing", "invoices"), "topic 'orders', not 'invoices'"),
    ):
        err = handle_mismatch(HANDLE, *args)
        assert err is not None
        assert (err.status, err.code) == (INVALID, E.INVALID_RECEIPT_HANDLE)
        assert says in str(err)


@pytest.mark.parametrize("text", ["", "not-a-handle", HANDLE.encode()[:-2], "A" * 5000])
def test_text_that_is_no_handle_is_invalid(text: str) -> None:
    with pytest.raises(ServiceError) as err:
        parse_handle(text)
    assert (err.value.status, err.value.code, err.value.retriable) == (
        INVALID,
        E.INVALID_RECEIPT_HANDLE,
        False,
    )
    assert parse_handle(HANDLE.encode()) == HANDLE


def test_model_and_disabled_refusals_say_how_to_change_them() -> None:
    err = model_mismatch("billing", broker_pb2.OFFSETS, broker_pb2.RECEIVE)
    assert (err.status, err.code, err.retriable) == (FAILED, E.CONSUME_MODEL_MISMATCH, False)
    assert "offsets (model OFFSETS" in str(err) and "receive/ack (model RECEIVE" in str(err)
    assert "`tidemq consumer-group update billing --model receive`" in str(err)
    err = consume_disabled("billing")
    assert (err.status, err.code, err.retriable) == (FAILED, E.CONSUME_DISABLED, False)
    assert "--consume-enabled true" in str(err)
