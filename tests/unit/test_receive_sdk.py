"""The receive/ack SDK's decisions that need no broker: received messages, ack batching,
invisibility renewal, listener answers, the message group property and the consumer-group
admin values."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import tidemq
from tests.unit.receive_sdk_helpers import Results, _received
from tidemq import errors
from tidemq.admin import AsyncAdmin, ConsumerGroup, RetryPolicy
from tidemq.admin.consumer_groups import DEFAULT_DELAYS_MS
from tidemq.consumer import push, push_blocking, simple
from tidemq.consumer.acks import AckBatcher, PendingAcks
from tidemq.consumer.push import consume_outcome
from tidemq.consumer.receive_config import (
    PushConsumerConfig,
)
from tidemq.consumer.renewal import Hold, Renewal, check_interval_ms, decide
from tidemq.producer.pending import Pending
from tidemq.producer.sender import add_to_request
from tidemq.protos import broker_pb2, common_pb2
from tidemq.types import ConsumeResult, Message, ReceivedMessage

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- messages
def test_a_received_message_carries_its_delivery() -> None:
    r = broker_pb2.ReceivedMessage(
        message=common_pb2.StoredMessage(topic="t", queue_id=2, queue_offset=7, body=b"x"),
        receipt_handle="H",
        delivery_attempt=3,
        invisible_until_ms=99,
        message_group="g1",
    )
    m = ReceivedMessage.from_received(r, "broker-a")
    assert (m.topic, m.queue_id, m.queue_offset, m.body, m.broker) == ("t", 2, 7, b"x", "broker-a")
    assert (m.receipt_handle, m.delivery_attempt, m.invisible_until_ms) == ("H", 3, 99)
    assert m.message_group == "g1"
    r.message_group = ""
    assert ReceivedMessage.from_received(r, "b").message_group is None
    assert m.as_dict()["delivery_attempt"] == 3


def test_a_received_message_built_fast_is_the_same_frozen_value_as_one_built_field_by_field() -> (
    None
):
    r = broker_pb2.ReceivedMessage(
        message=common_pb2.StoredMessage(
            topic="t",
            queue_id=1,
            queue_offset=5,
            body=b"b",
            tag="tg",
            keys=["k1", "k2"],
            properties={"p": "v"},
            msg_id="M",
            born_timestamp_ms=1,
            store_timestamp_ms=2,
            commitlog_offset=3,
            born_host="h1",
            store_host="h2",
            reconsume_times=4,
        ),
        receipt_handle="H",
        delivery_attempt=2,
        invisible_until_ms=9,
        message_group="g",
    )
    fast = ReceivedMessage.from_received(r, "b")
    m = r.message
    slow = ReceivedMessage(
        topic="t",
        queue_id=1,
        queue_offset=5,
        body=b"b",
        tag="tg",
        keys=("k1", "k2"),
        properties={"p": "v"},
        msg_id="M",
        born_timestamp_ms=1,
        store_timestamp_ms=2,
        broker="b",
        commitlog_offset=3,
        born_host="h1",
        store_host="h2",
        reconsume_times=m.reconsume_times,
        receipt_handle="H",
        delivery_attempt=2,
        message_group="g",
        invisible_until_ms=9,
    )
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    assert fast == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.topic = "other"  # type: ignore[misc]
    empty = ReceivedMessage.from_received(broker_pb2.ReceivedMessage(), "b")
    assert (empty.keys, empty.properties, empty.tag, empty.message_group) == ((), {}, None, None)


def test_a_new_handle_replaces_the_old_in_place_and_the_message_stays_equal() -> None:
    m = _received("t", "a", "old")
    twin = _received("t", "a", "old")
    m.renew("new", 1234)
    assert (m.receipt_handle, m.invisible_until_ms) == ("new", 1234)
    assert m == twin


def test_message_group_and_sharding_key_are_one_setting() -> None:
    assert Message("t", b"", message_group="g").sharding_key == "g"
    assert Message("t", b"", sharding_key="k").message_group == "k"
    assert Message("t", b"", message_group="g", sharding_key="g").message_group == "g"
    with pytest.raises(ValueError, match="differ"):
        Message("t", b"", message_group="g", sharding_key="k")


def test_a_message_group_travels_as_the_sharding_key_property() -> None:
    request = broker_pb2.SendMessageRequest()
    loop = asyncio.new_event_loop()
    try:
        p = Pending("t", b"x", "", (), {"a": "1"}, loop.create_future(), 0.0, "customer-42")
        plain = Pending("t", b"y", "", (), None, loop.create_future(), 0.0, None)
    finally:
        loop.close()
    add_to_request(request, p)
    add_to_request(request, plain)
    with_group, without = request.messages
    assert dict(with_group.properties) == {"a": "1", "__SHARDINGKEY": "customer-42"}
    assert dict(without.properties) == {}


# ---------------------------------------------------------------- push consumer pieces
def test_only_success_acks_anything_else_is_a_failure() -> None:
    assert consume_outcome(ConsumeResult.SUCCESS) is ConsumeResult.SUCCESS
    for answer in (ConsumeResult.FAILURE, None, True, "SUCCESS", 0):
        assert consume_outcome(answer) is ConsumeResult.FAILURE


def test_pending_acks_batch_per_topic_and_broker_group_up_to_the_limit() -> None:
    acks = PendingAcks(max_messages=2)
    a1, a2, b1 = _received("t", "a", "1"), _received("t", "a", "2"), _received("t", "b", "3")
    assert acks.add(a1) is None
    assert acks.add(b1) is None
    assert acks.add(a2) == [a1, a2]  # full: sent now
    assert len(acks) == 1
    assert acks.take_all() == [[b1]]
    assert acks.take_all() == [] and len(acks) == 0


def test_ack_batcher_sends_a_full_batch_at_once_and_the_rest_after_the_linger() -> None:
    sent: list[list[str]] = []
    outcomes: list[tuple[str, errors.TidemqError | None]] = []
    second = asyncio.Event()

    async def ack(topic: str, broker: str, handles: list[str]) -> Results:
        sent.append(handles)
        if len(sent) == 2:
            second.set()
        return [None] * len(handles)

    async def run() -> None:
        batcher = AckBatcher(ack, 2, 50, lambda m, e: outcomes.append((m.receipt_handle, e)))
        batcher.add(_received("t", "a", "1"))
        batcher.add(_received("t", "a", "2"))
        await asyncio.sleep(0)  # the full batch's send starts at once
        await asyncio.sleep(0)
        assert sent == [["1", "2"]]
        batcher.add(_received("t", "a", "3"))
        await asyncio.sleep(0.01)
        assert sent == [["1", "2"]]  # lingering
        await asyncio.wait_for(second.wait(), 2)
        assert sent == [["1", "2"], ["3"]]
        await batcher.close()

    asyncio.run(run())
    assert outcomes == [("1", None), ("2", None), ("3", None)]


def test_ack_batcher_close_sends_what_waits_and_reports_a_failed_call_per_message() -> None:
    outcomes: list[tuple[str, errors.TidemqError | None]] = []

    async def ack(topic: str, broker: str, handles: list[str]) -> Results:
        raise errors.BrokerUnavailableError("no master", code="NOT_MASTER")

    async def run() -> None:
        batcher = AckBatcher(ack, 100, 60_000, lambda m, e: outcomes.append((m.receipt_handle, e)))
        batcher.add(_received("t", "a", "1"))
        batcher.add(_received("t", "b", "2"))
        await batcher.close()  # long before the linger

    asyncio.run(run())
    assert sorted(h for h, _ in outcomes) == ["1", "2"]
    assert all(isinstance(e, errors.BrokerUnavailableError) for _, e in outcomes)


def test_a_running_message_is_renewed_in_the_last_third_of_its_invisibility() -> None:
    hold = Hold(started_ms=0, deadline_ms=30_000)
    assert decide(hold, 19_999, 30_000, 900_000) is Renewal.WAIT
    assert decide(hold, 20_000, 30_000, 900_000) is Renewal.RENEW
    hold.renewing = True
    assert decide(hold, 25_000, 30_000, 900_000) is Renewal.WAIT  # one renewal at a time
    hold.renewing, hold.deadline_ms = False, 55_000
    assert decide(hold, 25_000, 30_000, 900_000) is Renewal.WAIT


def test_renewal_stops_after_the_consume_timeout_and_for_a_released_hold() -> None:
    hold = Hold(started_ms=1_000, deadline_ms=2_000)
    assert decide(hold, 61_000, 30_000, 60_000) is Renewal.GIVE_UP
    hold.released = True
    assert decide(hold, 1_900, 30_000, 60_000) is Renewal.WAIT


def test_holds_are_checked_often_enough_for_short_and_long_durations() -> None:
    assert check_interval_ms(1_000) == 166  # a 1 s hold is seen 6 times
    assert check_interval_ms(30_000) == 1_000
    assert check_interval_ms(10) == 50


# ---------------------------------------------------------------- names and admin values
def test_the_receive_sdk_is_importable_from_tidemq() -> None:
    assert tidemq.SimpleConsumer is simple.SimpleConsumer
    assert tidemq.AsyncSimpleConsumer is simple.AsyncSimpleConsumer
    assert tidemq.PushConsumer is push_blocking.PushConsumer
    assert tidemq.AsyncPushConsumer is push.AsyncPushConsumer
    assert tidemq.ConsumeResult.SUCCESS is ConsumeResult.SUCCESS
    assert tidemq.PushConsumerConfig is PushConsumerConfig


def test_retry_policy_unset_on_the_wire_means_rocketmq_delays() -> None:
    assert RetryPolicy.from_proto(broker_pb2.RetryPolicy()).delays_ms == DEFAULT_DELAYS_MS
    assert len(DEFAULT_DELAYS_MS) == 18 and DEFAULT_DELAYS_MS[-1] == 7_200_000
    custom = RetryPolicy((100, 200))
    assert RetryPolicy.from_proto(custom.to_proto()) == custom
    exp = RetryPolicy.exponential(500, 60_000, 3.0)
    assert RetryPolicy.from_proto(exp.to_proto()) == exp
    with pytest.raises(ValueError, match="retry"):
        RetryPolicy((0,))
    with pytest.raises(ValueError, match="retry"):
        RetryPolicy.exponential(10, 5)


def test_consumer_group_reads_model_and_settings_from_the_wire() -> None:
    g = broker_pb2.SubscriptionGroup(
        group="billing",
        mode=broker_pb2.CLUSTERING,
        topics=["orders"],
        model=broker_pb2.RECEIVE,
        settings=broker_pb2.ConsumerGroupSettings(
            max_delivery_attempts=5,
            retry_policy=broker_pb2.RetryPolicy(delays_ms=[1_000, 2_000]),
            fifo=True,
            consume_enabled=True,
        ),
    )
    cg = ConsumerGroup.from_proto(g, ["b", "a"])
    assert (cg.group, cg.model, cg.mode, cg.topics) == (
        "billing",
        "receive",
        "clustering",
        ("orders",),
    )
    assert (cg.max_delivery_attempts, cg.fifo, cg.consume_enabled) == (5, True, True)
    assert cg.retry_policy.delays_ms == (1_000, 2_000)
    assert cg.brokers == ("a", "b")
    assert ConsumerGroup.from_proto(broker_pb2.SubscriptionGroup(group="new")).model == ""


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"retry_delays_s": [1], "retry_policy": RetryPolicy()}, "not both"),
        ({"retry_delays_s": [0]}, "retry delays must be > 0"),
        ({"model": "pop"}, "model must be one of"),
    ],
)
def test_bad_group_updates_are_refused_before_any_broker_is_asked(
    settings: dict[str, object], message: str
) -> None:
    async def run() -> None:
        # No nameserver listens on this address: a call would fail with UNAVAILABLE instead.
        async with AsyncAdmin("127.0.0.1:1") as admin:
            await admin.update_consumer_group("billing", **settings)  # type: ignore[arg-type]

    with pytest.raises(errors.InvalidArgumentError, match=message):
        asyncio.run(run())
