"""Receive groups' order and position on real broker processes: FIFO message groups, and an
offset reset that forgets what was in flight."""

from __future__ import annotations

import pytest

from tests.integration.conftest import StartBroker
from tests.integration.receiving import (
    FAST,
    GROUP,
    TOPIC,
    ack,
    codes,
    create_topic,
    nack,
    receive,
    receive_until,
    send,
    set_group,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration


def test_an_offset_reset_of_a_receive_group_forgets_what_was_in_flight_and_goes_on_there(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    send(b, [f"r{i}".encode() for i in range(5)])
    first = sorted(receive(b, invisible_ms=60_000), key=lambda m: m.message.queue_offset)
    assert len(first) == 5
    r = b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=1, reset=True),
        timeout=10,
    )
    assert r.offset == 1
    again = sorted(receive(b), key=lambda m: m.message.queue_offset)
    assert [m.message.queue_offset for m in again] == [1, 2, 3, 4]
    assert {m.delivery_attempt for m in again} == {1}
    assert codes(ack(b, [first[0].receipt_handle, first[3].receipt_handle])) == [
        "MESSAGE_ALREADY_ACKED",
        "RECEIPT_HANDLE_EXPIRED",
    ]
    assert codes(ack(b, [m.receipt_handle for m in again])) == ["OK"] * 4

    def committed() -> int:
        q = b.stub().QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0), timeout=10
        )
        return int(q.offset)

    # The revive task commits the group's floor: lag and retention see receive groups.
    wait_until(lambda: committed() == 5, 10, "the floor committed as the group's offset")


def test_fifo_message_groups_keep_their_order_and_a_stuck_group_does_not_hold_up_another(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, fifo=True, delays_ms=[400])
    msgs = [
        common_pb2.Message(
            topic=TOPIC, body=body.encode(), queue_id=0, properties={"__SHARDINGKEY": body[0]}
        )
        for body in ("A1", "B1", "A2", "B2", "A3")
    ]
    b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
    first = receive(b, invisible_ms=60_000)
    assert [(m.message.body, m.message_group) for m in first] == [(b"A1", "A"), (b"B1", "B")]
    a1, b1 = first
    # A is stuck (A1 failed and waits for its retry); B goes on.
    assert codes(nack(b, [a1.receipt_handle])) == ["OK"]
    assert codes(ack(b, [b1.receipt_handle])) == ["OK"]
    (b2,) = receive(b, invisible_ms=60_000)
    assert b2.message.body == b"B2"
    assert codes(ack(b, [b2.receipt_handle])) == ["OK"]
    # A1 comes again before anything after it in its group.
    (again,) = receive_until(b, 1, invisible_ms=60_000)
    assert (again.message.body, again.delivery_attempt) == (b"A1", 2)
    assert receive(b, wait_ms=200) == []
    assert codes(ack(b, [again.receipt_handle])) == ["OK"]
    (a2,) = receive_until(b, 1, invisible_ms=60_000)
    assert a2.message.body == b"A2"
    assert codes(ack(b, [a2.receipt_handle])) == ["OK"]
    (a3,) = receive_until(b, 1)
    assert a3.message.body == b"A3"
