"""Consumption over the RocketMQ 5 protocol (apache.rocketmq.v2) on a real broker process with
its v2 listener, through our own generated stubs: what the official clients rely on (one
status element first, MESSAGE_NOT_FOUND when empty, the stream ends before the deadline, a new
handle from ChangeInvisibleDuration), over the broker's own receive semantics (redelivery,
dead-lettering, FIFO groups) shared with tidemq's own protocol."""

from __future__ import annotations

import hashlib
import time

import pytest

from tests.integration.conftest import BrokerProcess, StartBroker
from tests.integration.receiving import (
    GROUP,
    TOPIC,
    create_topic,
    send,
    set_group,
    state,
)
from tests.integration.receiving import ack as our_ack
from tests.integration.receiving import receive_until as our_receive_until
from tests.integration.rocketmq_v2 import message
from tests.integration.v2_receiving import (
    METADATA,
    V2Broker,
    ack,
    change,
    name,
    queue,
    receive,
    receive_until,
    seconds,
    start_v2,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2 as d
from tidemq.protos.rocketmq import service_pb2
from tidemq.services.broker.receive.handle import ReceiptHandle
from tidemq.storage.clock import now_ms

pytestmark = pytest.mark.integration


def from_start(b: BrokerProcess, group: str = GROUP, topic: str = TOPIC) -> None:
    """The group consumes the topic's queue 0 from its first message (a new v2 group starts at
    the end, as RocketMQ's does)."""
    set_group(b, group)
    b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(group=group, topic=topic, queue_id=0, offset=0, reset=True),
        timeout=10,
    )


@pytest.fixture
def v2(start_broker: StartBroker) -> V2Broker:
    v = start_v2(start_broker)
    create_topic(v.broker)
    from_start(v.broker)
    return v


def test_a_message_sent_on_our_protocol_is_received_over_v2_then_acked_for_good(
    v2: V2Broker,
) -> None:
    send(v2.broker, [b"hello"])
    r = receive(v2)
    # Exactly one status first, the messages, then the delivery timestamp.
    assert r.kinds == ["status", "message", "delivery_timestamp"]
    assert r.code == "OK"
    (m,) = r.messages
    sp = m.system_properties
    assert m.body == b"hello" and m.topic.name == TOPIC
    assert list(sp.keys) == ["hello"]
    assert sp.delivery_attempt == 1
    assert sp.receipt_handle and sp.message_id
    assert sp.body_encoding == d.IDENTITY
    assert sp.body_digest.type == d.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    a = ack(v2, [m])
    assert name(a.status.code) == "OK"
    assert [name(e.status.code) for e in a.entries] == ["OK"]
    assert a.entries[0].message_id == sp.message_id
    (q,) = state(v2.broker).queues
    assert (q.done_offset, q.inflight, q.retrying) == (1, 0, 0)
    # Acked once: the same handle again is stale.
    again = ack(v2, [m])
    assert name(again.status.code) == "INVALID_RECEIPT_HANDLE"
    assert [name(e.status.code) for e in again.entries] == ["INVALID_RECEIPT_HANDLE"]


def test_an_unacked_message_comes_again_after_its_invisible_time_with_delivery_attempt_2(
    v2: V2Broker,
) -> None:
    set_group(v2.broker, delays_ms=[100])
    send(v2.broker, [b"x"])
    (first,) = receive(v2, invisible_s=0.5).messages
    assert first.system_properties.delivery_attempt == 1
    (second,) = receive_until(v2, 1, invisible_s=30)
    assert second.body == b"x"
    assert second.system_properties.delivery_attempt == 2
    assert second.system_properties.message_id == first.system_properties.message_id
    # The first delivery's handle is over; the second's works.
    assert name(ack(v2, [first]).status.code) == "INVALID_RECEIPT_HANDLE"
    assert name(ack(v2, [second]).status.code) == "OK"


def test_change_invisible_duration_answers_a_new_handle_that_works_and_the_old_one_is_refused(
    v2: V2Broker,
) -> None:
    send(v2.broker, [b"slow"])
    (m,) = receive(v2, invisible_s=5).messages
    old = m.system_properties.receipt_handle
    r = change(v2, m, 60)
    assert name(r.status.code) == "OK"
    assert r.receipt_handle and r.receipt_handle != old
    # A refused change still answers a handle (the client takes it before reading the status).
    refused = change(v2, m, 60, handle=old)
    assert name(refused.status.code) == "INVALID_RECEIPT_HANDLE"
    assert refused.receipt_handle == old
    stale = ack(v2, [m])
    assert name(stale.status.code) == "INVALID_RECEIPT_HANDLE"
    m.system_properties.receipt_handle = r.receipt_handle
    assert name(ack(v2, [m]).status.code) == "OK"
    (q,) = state(v2.broker).queues
    assert (q.done_offset, q.inflight) == (1, 0)


def test_an_empty_receive_answers_message_not_found_within_the_long_poll_and_before_the_deadline(
    v2: V2Broker,
) -> None:
    r = receive(v2, poll_s=5, timeout_s=8)
    assert r.kinds == ["status"] and r.code == "MESSAGE_NOT_FOUND"
    assert 4.5 <= r.elapsed_s < 6.5, r.elapsed_s
    # A long poll longer than the call's deadline: the stream still ends before it.
    r = receive(v2, poll_s=20, timeout_s=6.5)
    assert r.code == "MESSAGE_NOT_FOUND"
    assert r.elapsed_s < 6.0, r.elapsed_s


def test_a_message_that_arrives_during_the_long_poll_is_answered_at_once(v2: V2Broker) -> None:
    set_group(v2.broker, "late")
    stream = v2.stub.ReceiveMessage(
        service_pb2.ReceiveMessageRequest(
            group=d.Resource(name="late"),
            message_queue=queue(),
            batch_size=4,
            invisible_duration=seconds(30),
            long_polling_timeout=seconds(15),
        ),
        timeout=20,
        metadata=METADATA,
    )
    # A new group's first look at the queue records where it starts: the receive is parked.
    wait_until(lambda: bool(state(v2.broker, "late").queues), 10, "the receive to look")
    send(v2.broker, [b"late"])
    sent = time.monotonic()
    elements = list(stream)
    assert time.monotonic() - sent < 5, "answered when the message came, not at the poll's end"
    assert [e.WhichOneof("content") for e in elements] == [
        "status",
        "message",
        "delivery_timestamp",
    ]
    assert elements[1].message.body == b"late"


def test_a_receive_takes_at_most_32_messages_and_follows_the_tag_filter(
    start_broker: StartBroker,
) -> None:
    v2 = start_v2(start_broker)
    create_topic(v2.broker)
    from_start(v2.broker)
    tagged = [
        common_pb2.Message(topic=TOPIC, body=str(i).encode(), tag="A" if i % 2 else "B")
        for i in range(80)
    ]
    v2.broker.stub().SendMessage(broker_pb2.SendMessageRequest(messages=tagged), timeout=30)
    r = receive(v2, batch=1000, tag="A")
    assert r.code == "OK"
    assert len(r.messages) == 32
    assert {m.system_properties.tag for m in r.messages} == {"A"}


def test_refusals_are_answered_as_one_status_element(v2: V2Broker) -> None:
    sql = receive(
        v2, filter_expression=d.FilterExpression(type=d.SQL, expression="a > 1"), poll_s=5
    )
    assert sql.kinds == ["status"] and sql.code == "ILLEGAL_FILTER_EXPRESSION"
    assert "SQL92" in sql.status.message
    other = receive(v2, message_queue=queue(broker_name="broker-z"))
    assert other.kinds == ["status"] and other.code == "BAD_REQUEST"
    assert "broker-z" in other.status.message
    short = receive(v2, invisible_s=0.01)
    assert short.code == "ILLEGAL_INVISIBLE_TIME"
    missing = receive(v2, topic="no-such-topic")
    assert missing.code == "TOPIC_NOT_FOUND"


def test_an_ack_with_one_stale_handle_answers_multiple_results_with_a_status_per_entry(
    v2: V2Broker,
) -> None:
    send(v2.broker, [b"a", b"b"])
    msgs = receive(v2).messages
    assert len(msgs) == 2
    assert name(ack(v2, msgs[:1]).status.code) == "OK"
    a = ack(v2, msgs)
    assert name(a.status.code) == "MULTIPLE_RESULTS"
    assert [name(e.status.code) for e in a.entries] == ["INVALID_RECEIPT_HANDLE", "OK"]


def test_a_message_received_over_v2_and_not_acked_is_received_on_our_protocol(
    v2: V2Broker,
) -> None:
    set_group(v2.broker, delays_ms=[100])
    send(v2.broker, [b"shared"])
    (m,) = receive(v2, invisible_s=0.3).messages
    # Same group, same in-flight state: our own protocol gets the redelivery.
    (got,) = our_receive_until(v2.broker, 1)
    assert got.message.body == b"shared" and got.delivery_attempt == 2
    assert not our_ack(v2.broker, [got.receipt_handle])[0].HasField("error")
    assert name(ack(v2, [m]).status.code) == "INVALID_RECEIPT_HANDLE"


def test_a_message_sent_over_v2_is_received_on_our_protocol_and_over_v2_with_its_id(
    v2: V2Broker,
) -> None:
    sent = message(TOPIC, b"from-v2", tag="T1", keys=["k1"])
    sent.user_properties["source"] = "v2"
    r = v2.stub.SendMessage(
        service_pb2.SendMessageRequest(messages=[sent]), timeout=10, metadata=METADATA
    )
    assert name(r.status.code) == "OK", r.status
    (ours,) = our_receive_until(v2.broker, 1)
    assert ours.message.body == b"from-v2" and ours.message.tag == "T1"
    assert list(ours.message.keys) == ["k1"] and ours.message.properties["source"] == "v2"
    # Another group reads it over v2: the client's own message id, tag, keys, property.
    from_start(v2.broker, group="other")
    (back,) = receive(v2, group="other").messages
    assert back.system_properties.message_id == sent.system_properties.message_id
    assert back.system_properties.tag == "T1" and list(back.system_properties.keys) == ["k1"]
    assert dict(back.user_properties) == {"source": "v2"}


def test_a_message_that_used_up_its_deliveries_goes_to_the_dead_letter_queue(
    v2: V2Broker,
) -> None:
    set_group(v2.broker, max_delivery_attempts=2, delays_ms=[100])
    send(v2.broker, [b"poison"])
    (m1,) = receive(v2, invisible_s=0.3).messages
    (m2,) = receive_until(v2, 1, invisible_s=0.3)
    assert m2.system_properties.delivery_attempt == 2
    wait_until(lambda: state(v2.broker).dead_letters == 1, 15, "the message in the DLQ")
    # Read back over v2 by another group: it names where it came from.
    dlq = f"%DLQ%{GROUP}"
    from_start(v2.broker, group="inspector", topic=dlq)
    (dead,) = receive(v2, group="inspector", topic=dlq).messages
    assert dead.body == b"poison"
    assert dead.system_properties.dead_letter_queue.topic == TOPIC
    # It is not delivered again to the group.
    assert receive(v2, poll_s=5, timeout_s=8).code == "MESSAGE_NOT_FOUND"
    assert m1.system_properties.message_id == m2.system_properties.message_id


def test_forward_to_dead_letter_queue_moves_the_message_at_once(v2: V2Broker) -> None:
    send(v2.broker, [b"give-up"])
    (m,) = receive(v2).messages
    r = v2.stub.ForwardMessageToDeadLetterQueue(
        service_pb2.ForwardMessageToDeadLetterQueueRequest(
            group=d.Resource(name=GROUP),
            topic=d.Resource(name=TOPIC),
            receipt_handle=m.system_properties.receipt_handle,
            message_id=m.system_properties.message_id,
            delivery_attempt=1,
            max_delivery_attempts=16,
        ),
        timeout=10,
        metadata=METADATA,
    )
    assert name(r.status.code) == "OK"
    assert state(v2.broker).dead_letters == 1
    assert name(ack(v2, [m]).status.code) == "INVALID_RECEIPT_HANDLE"


def test_a_fifo_groups_next_message_waits_for_the_previous_ones_ack(v2: V2Broker) -> None:
    set_group(v2.broker, fifo=True)
    msgs = [
        common_pb2.Message(
            topic=TOPIC, body=body, queue_id=0, properties={"__SHARDINGKEY": "order-1"}
        )
        for body in (b"first", b"second")
    ]
    v2.broker.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
    (first,) = receive(v2).messages
    assert first.body == b"first"
    assert first.system_properties.message_group == "order-1"
    held = receive(v2, poll_s=5, timeout_s=8)
    assert held.code == "MESSAGE_NOT_FOUND"
    assert name(ack(v2, [first]).status.code) == "OK"
    (second,) = receive(v2).messages
    assert second.body == b"second"


def test_an_auto_renew_receive_holds_its_messages_for_60_seconds_and_acks_with_its_handle(
    v2: V2Broker,
) -> None:
    send(v2.broker, [b"push"])
    before_ms = now_ms()
    (m,) = receive(v2, invisible_s=None, auto_renew=True).messages
    handle = ReceiptHandle.decode(m.system_properties.receipt_handle)
    assert before_ms + 59_000 <= handle.invisible_until_ms <= now_ms() + 60_000
    (q,) = state(v2.broker).queues
    assert q.inflight == 1
    assert name(ack(v2, [m]).status.code) == "OK"
