"""The receive/ack SDK's calls without a broker: settings, the wire requests it builds, typed
errors, per-handle results and settling many messages in per-broker calls."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from tests.unit.receive_sdk_helpers import Results, _received
from tidemq import errors
from tidemq.consumer.receive_calls import ReceiveCalls
from tidemq.consumer.receive_config import (
    PushConsumerConfig,
    SimpleConsumerConfig,
    invisible_ms,
    subscriptions_of,
)
from tidemq.consumer.settling import per_handle, settle_many
from tidemq.errors import from_detail, from_rpc_error
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import error_metadata

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be > 0"),
        ({"receive_batch_size": -1}, "receive_batch_size must be > 0"),
        ({"buffer_messages": -1}, "buffer_messages must be >= 0"),
        ({"invisible_duration_s": 0}, "invisible duration must be > 0"),
        ({"invisible_duration_s": -5.0}, "invisible duration must be > 0"),
        ({"invisible_duration_s": math.nan}, "invisible duration must be > 0"),
        ({"invisible_duration_s": math.inf}, "invisible duration must be > 0"),
        ({"ack_batch_max_messages": 0}, "ack_batch_max_messages must be > 0"),
        ({"ack_linger_ms": -1}, "ack_linger_ms must be >= 0"),
        ({"consume_timeout_ms": 0}, "consume_timeout_ms must be > 0"),
        ({"long_poll_ms": -1}, "long_poll_ms must be >= 0"),
        ({"long_poll_ms": 0}, "long_poll_ms must be > 0 for a push consumer"),
        ({"start_from": "middle"}, "start_from must be"),
        ({"request_timeout_ms": 0}, "request_timeout_ms must be > 0"),
    ],
)
def test_push_consumer_settings_are_refused_once_with_the_reason(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match="invalid push consumer settings") as e:
        PushConsumerConfig(**settings)  # type: ignore[arg-type]
    assert problem in str(e.value)


def test_simple_consumer_settings_name_every_problem_at_once() -> None:
    with pytest.raises(ValueError, match="invalid simple consumer settings") as e:
        SimpleConsumerConfig(long_poll_ms=-1, heartbeat_interval_ms=0, start_from=True)
    text = str(e.value)
    assert "long_poll_ms must be >= 0" in text
    assert "heartbeat_interval_ms must be > 0" in text
    assert "start_from must be" in text


def test_default_settings_are_valid_and_start_from_accepts_a_timestamp() -> None:
    assert PushConsumerConfig().max_concurrency == 16
    assert SimpleConsumerConfig(start_from=1_700_000_000_000).start_from == 1_700_000_000_000


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf, True, "30"])
def test_bad_invisible_durations_are_typed_invalid_argument_errors(seconds: object) -> None:
    with pytest.raises(errors.InvalidArgumentError) as e:
        invisible_ms(seconds)  # type: ignore[arg-type]
    assert e.value.code == "INVALID_ARGUMENT" and not e.value.retriable


def test_invisible_duration_in_seconds_becomes_ms() -> None:
    assert invisible_ms(30) == 30_000
    assert invisible_ms(1.5) == 1_500
    assert invisible_ms(0.0001) == 1  # never 0: the broker refuses it anyway, with its limit


def test_subscriptions_take_a_topic_or_a_mapping_of_tag_expressions() -> None:
    assert subscriptions_of("orders") == {"orders": "*"}
    assert subscriptions_of({"b": "x || y", "a": " "}) == {"a": "*", "b": "x || y"}
    for bad in ("", {}, {"": "*"}):
        with pytest.raises(ValueError, match="subscription"):
            subscriptions_of(bad)


# ---------------------------------------------------------------- requests on the wire
def _calls(subscriptions: dict[str, str]) -> ReceiveCalls:
    return ReceiveCalls(
        "127.0.0.1:1",
        group="billing",
        subscriptions=subscriptions,
        client_id="me",
        start_from="first",
        request_timeout_ms=1_000,
        route_refresh_ms=1_000,
    )


def test_heartbeat_announces_the_receive_model_and_every_subscription() -> None:
    request = _calls({"orders": "created", "payments": "*"}).heartbeat_request()
    [member] = request.consumers
    assert request.client_id == "me"
    assert member.group == "billing" and member.model == broker_pb2.RECEIVE
    assert [(s.topic, s.tag_expression) for s in member.subscriptions] == [
        ("orders", "created"),
        ("payments", "*"),
    ]


def test_receive_asks_any_queue_of_the_topic_with_the_invisible_duration() -> None:
    r = _calls({"orders": "created || paid"}).receive_request("orders", 16, 30_000, 5_000)
    assert (r.group, r.topic, r.queue_id) == ("billing", "orders", -1)
    assert (r.max_messages, r.invisible_duration_ms, r.long_poll_timeout_ms) == (16, 30_000, 5_000)
    assert (r.tag_expression, r.client_id, r.start_from) == ("created || paid", "me", "first")


def test_a_consumer_group_is_required() -> None:
    with pytest.raises(ValueError, match="group is required"):
        ReceiveCalls(
            None,
            group="",
            subscriptions={"t": "*"},
            client_id="x",
            start_from="last",
            request_timeout_ms=1,
            route_refresh_ms=1,
        )


# ---------------------------------------------------------------- errors
class _FakeRpcError(grpc.RpcError):  # type: ignore[misc]
    """A failed call as grpc hands it to the SDK (status, details, trailing metadata)."""

    def __init__(self, detail: common_pb2.ErrorDetail) -> None:
        self._detail = detail

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self) -> tuple[tuple[str, bytes]]:
        return error_metadata(self._detail)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (common_pb2.INVALID_RECEIPT_HANDLE, errors.InvalidReceiptHandle),
        (common_pb2.RECEIPT_HANDLE_EXPIRED, errors.ReceiptHandleExpired),
        (common_pb2.MESSAGE_ALREADY_ACKED, errors.MessageAlreadyAcked),
        (common_pb2.CONSUME_MODEL_MISMATCH, errors.ConsumeModelMismatch),
        (common_pb2.CONSUME_DISABLED, errors.ConsumeDisabled),
    ],
)
def test_receive_error_codes_map_to_their_typed_errors(
    code: int, cls: type[errors.TidemqError]
) -> None:
    detail = common_pb2.ErrorDetail(code=code, message="why", retriable=False)
    e = from_rpc_error(_FakeRpcError(detail), "broker b")
    assert type(e) is cls
    assert e.code == common_pb2.ErrorCode.Name(code)
    assert not e.retriable
    assert "why (broker b)" in str(e)
    assert type(from_detail(detail)) is cls  # a handle's result in a batch answer, the same


def test_an_invalid_receipt_handle_is_an_invalid_argument() -> None:
    assert issubclass(errors.InvalidReceiptHandle, errors.InvalidArgumentError)


def test_an_error_code_this_sdk_does_not_know_keeps_its_number() -> None:
    e = from_detail(common_pb2.ErrorDetail(code=77, message="new", retriable=True))
    assert type(e) is errors.TidemqError and e.code == "77" and e.retriable


def test_per_handle_results_follow_the_handles_and_never_drop_one() -> None:
    results = [
        broker_pb2.HandleResult(
            receipt_handle="b",
            error=common_pb2.ErrorDetail(code=common_pb2.RECEIPT_HANDLE_EXPIRED, message="late"),
        ),
        broker_pb2.HandleResult(receipt_handle="a"),
    ]
    a, b, c = per_handle(results, ["a", "b", "c"], "broker group g")
    assert a is None
    assert isinstance(b, errors.ReceiptHandleExpired)
    assert isinstance(c, errors.TidemqError) and "no result" in str(c)


def test_settling_many_makes_one_call_per_topic_and_broker_group_in_order() -> None:
    calls: list[tuple[str, str, list[str]]] = []

    async def settle(
        topic: str, broker: str, handles: list[str]
    ) -> list[errors.TidemqError | None]:
        calls.append((topic, broker, handles))
        return [errors.ReceiptHandleExpired(h) if h == "h2" else None for h in handles]

    messages = [
        _received("t", "a", "h1"),
        _received("t", "b", "h2"),
        _received("t", "a", "h3"),
        _received("u", "a", "h4"),
    ]
    out = asyncio.run(settle_many(settle, messages))
    assert sorted(calls) == [("t", "a", ["h1", "h3"]), ("t", "b", ["h2"]), ("u", "a", ["h4"])]
    assert [type(e).__name__ if e else None for e in out] == [
        None,
        "ReceiptHandleExpired",
        None,
        None,
    ]


def test_settling_more_than_the_brokers_limit_splits_the_calls() -> None:
    sizes: list[int] = []

    async def settle(topic: str, broker: str, handles: list[str]) -> Results:
        sizes.append(len(handles))
        return [None] * len(handles)

    messages = [_received("t", "a", f"h{i}") for i in range(2_500)]
    assert asyncio.run(settle_many(settle, messages)) == [None] * 2_500
    assert sorted(sizes) == [452, 1024, 1024]


def test_a_settle_call_that_fails_as_a_whole_fails_only_its_own_messages() -> None:
    async def settle(topic: str, broker: str, handles: list[str]) -> Results:
        if broker == "down":
            raise errors.BrokerUnavailableError("no master", code="NOT_MASTER")
        return [None] * len(handles)

    messages = [_received("t", "down", "h1"), _received("t", "up", "h2")]
    first, second = asyncio.run(settle_many(settle, messages))
    assert isinstance(first, errors.BrokerUnavailableError) and second is None


def test_settling_a_message_without_a_handle_is_refused_before_any_call() -> None:
    async def settle(
        topic: str, broker: str, handles: list[str]
    ) -> list[errors.TidemqError | None]:
        raise AssertionError("no call expected")

    with pytest.raises(errors.InvalidArgumentError, match="receipt handle"):
        asyncio.run(settle_many(settle, [_received("t", "a", "")]))
