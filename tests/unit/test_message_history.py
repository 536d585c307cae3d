"""A message's life, without sockets: the broker's collection of one message's receive-log
events (``MessageTrail``), and the admin's assembly of them into a history (``assemble_history``):
deliveries with their client, ends of unsettled invisible times, acks, dead-lettering, and what
pull groups' committed offsets say."""

from __future__ import annotations

import pytest

from tidemq.admin.message_history import MessageEventKind, assemble_history
from tidemq.admin.messages import msg_id_address
from tidemq.errors import InvalidArgumentError
from tidemq.protos import broker_pb2
from tidemq.services.broker.receive.events import (
    Acked,
    Changed,
    Dead,
    Event,
    Init,
    QueueKey,
    Received,
    Reset,
    encode_event,
)
from tidemq.services.broker.receive.history import MessageTrail
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.types import ReceivedMessage

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000
KEY = QueueKey("billing", "orders", 3)
OFFSET = 41


def trail_of(records: list[tuple[Event, int, int]]) -> list[broker_pb2.MessageEvent]:
    trail = MessageTrail("orders", 3, OFFSET)
    for event, log_offset, store_ms in records:
        trail.feed(encode_event(event), log_offset, store_ms)
    return trail.events


def test_the_trail_keeps_only_the_events_of_its_message_with_client_and_lease() -> None:
    other_queue = QueueKey("billing", "orders", 4)
    other_topic = QueueKey("billing", "orders-eu", 3)
    events = trail_of(
        [
            (Init(KEY, 40), 100, T0),
            (Received(KEY, T0, T0 + 1000, ((40, 1, 0), (41, 1, 0)), (), (), 42, "c1"), 200, T0),
            (Received(other_queue, T0, T0 + 1000, ((41, 1, 0),), (), (), 42, "x"), 300, T0),
            (Received(other_topic, T0, T0 + 1000, ((41, 1, 0),), (), (), 42, "x"), 400, T0),
            (Changed(KEY, T0 + 10, ((41, 200, T0 + 5000),), False), 500, T0 + 10),
            (Changed(KEY, T0 + 20, ((41, 500, T0 + 6000),), True), 600, T0 + 20),
            (Received(KEY, T0 + 7000, T0 + 8000, ((41, 2, 0),), (), (), 42), 700, T0 + 7000),
            (Acked(KEY, ((40, 200), (41, 700))), 800, T0 + 7100),
            (Dead(KEY, ((41, 700),)), 900, T0 + 7200),
            (Received(QueueKey("audit", "orders", 3), T0, T0 + 1, (), (41,), (), 42), 950, T0),
            (Reset(KEY, 10), 1000, T0 + 9000),
        ]
    )
    got = [
        (
            broker_pb2.MessageEventKind.Name(e.kind),
            e.group,
            e.time_ms,
            e.client_id,
            e.attempt,
            e.lease_id,
            e.new_lease_id,
        )
        for e in events
    ]
    assert got == [
        ("DELIVERED", "billing", T0, "c1", 1, 200, 0),
        ("INVISIBLE_CHANGED", "billing", T0 + 10, "", 0, 200, 500),
        ("NACKED", "billing", T0 + 20, "", 0, 500, 0),
        ("DELIVERED", "billing", T0 + 7000, "", 2, 700, 0),  # a kind 2 record: no client
        ("ACKED", "billing", T0 + 7100, "", 0, 700, 0),
        ("DEAD_LETTERED", "billing", T0 + 7200, "", 0, 700, 0),
        ("FILTERED", "audit", T0, "", 0, 0, 0),
        ("QUEUE_RESET", "billing", T0 + 9000, "", 0, 0, 0),
    ]
    assert events[0].invisible_until_ms == T0 + 1000
    assert events[1].invisible_until_ms == T0 + 5000
    assert events[-1].reset_offset == 10


def test_the_trail_skips_undecodable_records_of_its_topic_and_counts_them() -> None:
    trail = MessageTrail("orders", 3, OFFSET)
    good = encode_event(Acked(KEY, ((41, 7),)))
    trail.feed(good[:-1], 10, T0)  # truncated
    trail.feed(b"\x09" + good[1:], 11, T0)  # a version this broker does not know
    trail.feed(good, 12, T0)
    assert trail.undecodable == 2
    assert [broker_pb2.MessageEventKind.Name(e.kind) for e in trail.events] == ["ACKED"]


def test_a_receive_naming_its_client_changes_the_state_exactly_as_one_without() -> None:
    # Slaves and restarts apply kind 7 and kind 2 records alike: the client is history only.
    with_client, without = ReceiveStates(), ReceiveStates()
    for states, client in ((with_client, "c1"), (without, "")):
        states.apply(Init(KEY, 40), 1)
        states.apply(Received(KEY, T0, T0 + 1000, ((40, 1, 7), (41, 1, 0)), (), (), 42, client), 2)
        states.apply(Acked(KEY, ((40, 2),)), 3)
    assert with_client == without
    assert with_client.encode_snapshot(4) == without.encode_snapshot(4)


def message(offset: int = OFFSET) -> ReceivedMessage:
    return ReceivedMessage(
        topic="orders",
        queue_id=3,
        queue_offset=offset,
        body=b"x",
        tag=None,
        keys=(),
        properties={},
        msg_id="7F00000100002A9F0000000000000000",
        born_timestamp_ms=T0 - 5,
        store_timestamp_ms=T0 - 2,
        broker="broker-a",
        born_host="10.0.0.9:5000",
    )


def answer(
    *events: broker_pb2.MessageEvent, **fields: object
) -> broker_pb2.GetMessageHistoryResponse:
    return broker_pb2.GetMessageHistoryResponse(events=list(events), **fields)


def ev(kind: int, time_ms: int, **fields: object) -> broker_pb2.MessageEvent:
    return broker_pb2.MessageEvent(kind=kind, group="billing", time_ms=time_ms, **fields)


B = broker_pb2


def test_a_redelivered_then_acked_message_shows_both_deliveries_the_lapse_and_the_ack() -> None:
    h = assemble_history(
        message(),
        answer(
            ev(
                B.DELIVERED,
                T0,
                client_id="c1",
                attempt=1,
                invisible_until_ms=T0 + 1000,
                lease_id=200,
            ),
            ev(
                B.DELIVERED,
                T0 + 2000,
                client_id="c1",
                attempt=2,
                invisible_until_ms=T0 + 32000,
                lease_id=700,
            ),
            ev(B.ACKED, T0 + 2100, lease_id=700),
            offsets=[B.GroupQueueOffset(group="billing", offset=OFFSET + 1, model=B.RECEIVE)],
        ),
        now_ms=T0 + 60_000,
    )
    K = MessageEventKind
    assert [(e.kind, e.time_ms, e.client_id, e.attempt) for e in h.events] == [
        (K.STORED, T0 - 2, None, None),
        (K.DELIVERED, T0, "c1", 1),
        (K.INVISIBILITY_ENDED, T0 + 1000, "c1", 1),
        (K.REDELIVERED, T0 + 2000, "c1", 2),
        (K.ACKED, T0 + 2100, "c1", 2),
    ]
    assert h.events[0].born_host == "10.0.0.9:5000"
    (g,) = h.groups
    assert (g.group, g.model, g.state, g.deliveries, g.committed_offset) == (
        "billing",
        "receive",
        "acked",
        2,
        OFFSET + 1,
    )
    assert not h.truncated and h.notes == []
    assert h.as_dict()["events"][2]["kind"] == "invisibility_ended"


def test_an_expired_last_attempt_moved_by_the_revive_shows_its_lapse_then_the_dlq() -> None:
    h = assemble_history(
        message(),
        answer(
            ev(
                B.DELIVERED,
                T0,
                client_id="c1",
                attempt=1,
                invisible_until_ms=T0 + 1000,
                lease_id=200,
            ),
            ev(B.DEAD_LETTERED, T0 + 1500, lease_id=200),
        ),
        now_ms=T0 + 60_000,
    )
    kinds = [(e.kind, e.dead_letter_topic) for e in h.events]
    assert kinds == [
        (MessageEventKind.STORED, None),
        (MessageEventKind.DELIVERED, None),
        (MessageEventKind.INVISIBILITY_ENDED, None),
        (MessageEventKind.DEAD_LETTERED, "%DLQ%billing"),
    ]
    assert h.groups[0].state == "dead_lettered"


def test_a_nack_and_a_dead_letter_in_time_show_no_lapse_of_invisible_time() -> None:
    h = assemble_history(
        message(),
        answer(
            ev(
                B.DELIVERED,
                T0,
                client_id="c1",
                attempt=1,
                invisible_until_ms=T0 + 30_000,
                lease_id=200,
            ),
            ev(B.NACKED, T0 + 10, lease_id=200, invisible_until_ms=T0 + 1010),
            ev(
                B.DELIVERED,
                T0 + 1100,
                client_id="c2",
                attempt=2,
                invisible_until_ms=T0 + 31_100,
                lease_id=300,
            ),
            ev(
                B.INVISIBLE_CHANGED,
                T0 + 1200,
                lease_id=300,
                new_lease_id=400,
                invisible_until_ms=T0 + 90_000,
            ),
            ev(B.DEAD_LETTERED, T0 + 1300, lease_id=400),
        ),
        now_ms=T0 + 200_000,
    )
    K = MessageEventKind
    assert [(e.kind, e.client_id) for e in h.events[1:]] == [
        (K.DELIVERED, "c1"),
        (K.NACKED, "c1"),
        (K.REDELIVERED, "c2"),
        (K.INVISIBLE_TIME_CHANGED, "c2"),
        (K.DEAD_LETTERED, "c2"),
    ]


def test_pull_groups_show_only_what_their_committed_offsets_say() -> None:
    h = assemble_history(
        message(),
        answer(
            offsets=[
                B.GroupQueueOffset(group="analytics", offset=OFFSET + 5, model=B.OFFSETS),
                B.GroupQueueOffset(group="late", offset=OFFSET, model=B.OFFSETS),
            ]
        ),
        now_ms=T0,
    )
    assert [(e.kind, e.group, e.time_ms, e.offset, e.client_id) for e in h.events] == [
        (MessageEventKind.STORED, None, T0 - 2, None, None),
        (MessageEventKind.OFFSET_COMMITTED_PAST, "analytics", None, OFFSET + 5, None),
    ]
    assert [(g.group, g.state, g.deliveries) for g in h.groups] == [
        ("analytics", "consumed", 0),
        ("late", "not_consumed", 0),
    ]


def test_a_delivery_still_invisible_is_in_flight_and_a_truncated_scan_says_so() -> None:
    h = assemble_history(
        message(),
        answer(
            ev(
                B.DELIVERED, T0, client_id="c1", attempt=1, invisible_until_ms=T0 + 1000, lease_id=2
            ),
            truncated=True,
            scanned_records=100,
        ),
        now_ms=T0 + 500,
    )
    assert h.groups[0].state == "in_flight"
    assert h.truncated and "stopped at its bound" in h.notes[0]
    # Past the deadline, but the scan did not reach the log's end: no lapse is invented.
    later = assemble_history(
        message(),
        answer(
            ev(
                B.DELIVERED, T0, client_id="c1", attempt=1, invisible_until_ms=T0 + 1000, lease_id=2
            ),
            truncated=True,
        ),
        now_ms=T0 + 5000,
    )
    assert [e.kind for e in later.events][-1] is MessageEventKind.DELIVERED


def test_message_ids_name_their_store_address_and_malformed_ones_are_refused() -> None:
    assert msg_id_address("7F00000100002A9F0000000000000010") == "127.0.0.1:10911"
    for bad in ("", "zz", "7F000001", "7F00000100002A9F00000000000000100"):
        with pytest.raises(InvalidArgumentError) as e:
            msg_id_address(bad)
        assert e.value.code == "INVALID_MESSAGE_ID"
