"""The dead-letter copy of a message, through a real store: what the copy keeps of the original
(topic, id, keys, tags, properties, UNIQ_KEY, attempts) and what it adds, that the store accepts
it whatever the consumer's reason says or however full the original's properties were; and
which topics clients may send to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.services.broker.receive import dead_letter as dl
from tidemq.storage import Message, MessageStore, PutStatus, StoreConfig, StoredMessage
from tidemq.storage.record import PROPERTIES_MAX_BYTES, RECORD_CRC_SIZE, encode_properties

BORN_HOST = (b"\x0a\x00\x00\x07", 4242)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(
        StoreConfig(
            str(tmp_path / "store"),
            commitlog_file_size_bytes=1 << 20,
            consume_queue_entries_per_file=1000,
            index_slot_num=100,
            index_max_num=400,
        )
    ).open()
    yield s
    s.close()


def put_and_read(store: MessageStore, m: Message) -> StoredMessage:
    put = store.put_message(m)
    assert put.wait(10) is PutStatus.PUT_OK
    assert store.wait_dispatched(store.commitlog.max_offset, 10)
    return store.look_message(put.results[0].phy_offset)


def original(store: MessageStore, **props: str) -> StoredMessage:
    """A message as a producer sent it to queue 2 of "orders", after two others there."""
    for i in range(2):
        put_and_read(store, Message("orders", f"before-{i}".encode(), queue_id=2))
    return put_and_read(
        store,
        Message(
            "orders",
            b"the poison body",
            queue_id=2,
            tags="urgent",
            keys=("order-17", "customer-3"),
            properties={"UNIQ_KEY": "C0A8000100002A9F0000001F", "__SHARDINGKEY": "cust-3", **props},
            flag=5,
            born_timestamp_ms=1_700_000_000_123,
            born_host=BORN_HOST,
        ),
    )


def test_the_copy_keeps_the_message_and_names_its_origin(store: MessageStore) -> None:
    stored = original(store, region="eu")
    copy = dl.dead_letter_copy(
        stored,
        group="billing",
        attempts=16,
        reason=dl.max_attempts_reason(16),
        now_ms=1_800_000_000_000,
    )
    got = put_and_read(store, copy)

    assert (got.topic, got.queue_id, got.queue_offset) == ("%DLQ%billing", 0, 0)
    assert got.body == b"the poison body"
    assert got.tags == "urgent"
    assert got.keys == ["order-17", "customer-3"]
    assert (got.flag, got.born_timestamp_ms, got.born_host) == (5, 1_700_000_000_123, BORN_HOST)
    assert got.reconsume_times == 16
    assert got.properties == {
        "TAGS": "urgent",
        "KEYS": "order-17 customer-3",
        "UNIQ_KEY": "C0A8000100002A9F0000001F",
        "__SHARDINGKEY": "cust-3",
        "region": "eu",
        "RETRY_TOPIC": "orders",
        "ORIGIN_MESSAGE_ID": stored.msg_id,
        "DLQ_ORIGIN_QUEUE_ID": "2",
        "DLQ_ORIGIN_QUEUE_OFFSET": "2",
        "DLQ_DELIVERY_ATTEMPTS": "16",
        "DLQ_REASON": "max delivery attempts (16)",
        "DLQ_TIME_MS": "1800000000000",
    }
    # The copy is found by the original's keys and UNIQ_KEY in its DLQ topic.
    found = store.query_by_key("%DLQ%billing", "C0A8000100002A9F0000001F", 0, 2**62, 10)
    assert [m.body for m in found] == [b"the poison body"]


def test_a_message_resent_from_the_dlq_keeps_its_first_id(store: MessageStore) -> None:
    """Sent back to its topic with its ORIGIN_MESSAGE_ID (as resend does) and dead again: the
    new copy leads to the message first sent, as in RocketMQ."""
    first = original(store)
    resent = put_and_read(
        store,
        Message("orders", first.body, queue_id=2, properties={"ORIGIN_MESSAGE_ID": first.msg_id}),
    )
    assert resent.msg_id != first.msg_id
    copy = dl.dead_letter_copy(resent, group="g", attempts=16, reason="again", now_ms=1)
    got = put_and_read(store, copy)
    assert got.properties["ORIGIN_MESSAGE_ID"] == first.msg_id
    assert got.properties["DLQ_ORIGIN_QUEUE_OFFSET"] == "3"  # where it died this time


def test_a_consumers_reason_cannot_break_the_record(store: MessageStore) -> None:
    stored = original(store)
    reason = "bad\x01field\x02" + "x" * 5000
    got = put_and_read(
        store, dl.dead_letter_copy(stored, group="g", attempts=1, reason=reason, now_ms=1)
    )
    assert got.properties["DLQ_REASON"] == ("bad field " + "x" * 5000)[: dl.REASON_MAX_CHARS]
    assert got.properties["DLQ_DELIVERY_ATTEMPTS"] == "1"
    # No reason given: no empty property.
    silent = dl.dead_letter_copy(stored, group="g", attempts=1, reason="", now_ms=1)
    assert "DLQ_REASON" not in silent.properties


def test_an_original_with_full_properties_still_fits(store: MessageStore) -> None:
    """Its properties took nearly the whole limit: the copy drops the largest of the user's
    properties (and says which), never the origin or the message's identity."""
    base = {"UNIQ_KEY": "C0A8000100002A9F0000001F", "__SHARDINGKEY": "cust-3"}
    budget = PROPERTIES_MAX_BYTES - RECORD_CRC_SIZE
    full = {"TAGS": "urgent", "KEYS": "order-17 customer-3", **base, "small": "s", "big": ""}
    full["big"] = "b" * (budget - len(encode_properties(full)) - 10)
    stored = original(store, small="s", big=full["big"])

    copy = dl.dead_letter_copy(stored, group="g", attempts=16, reason="why", now_ms=7)
    got = put_and_read(store, copy)

    assert "big" not in got.properties
    assert got.properties["DLQ_DROPPED_PROPERTIES"] == "big"
    assert got.properties["small"] == "s"
    assert got.properties["UNIQ_KEY"] == base["UNIQ_KEY"]
    assert got.properties["RETRY_TOPIC"] == "orders"
    assert got.properties["ORIGIN_MESSAGE_ID"] == stored.msg_id
    assert got.properties["DLQ_DELIVERY_ATTEMPTS"] == "16"
    assert got.keys == ["order-17", "customer-3"] and got.tags == "urgent"


@pytest.mark.parametrize(
    ("topic", "system", "client_may_send"),
    [
        ("orders", False, True),
        ("%SYS%RECEIVE_LOG", True, False),
        ("%DLQ%billing", False, False),
        ("TBW102", False, True),
        ("a%SYS%b", False, True),  # only the prefix makes a system topic
    ],
)
def test_which_topics_clients_may_send_to(topic: str, system: bool, client_may_send: bool) -> None:
    assert dl.is_system_topic(topic) is system
    assert dl.client_may_send(topic) is client_may_send


def test_a_group_name_no_dead_letter_topic_can_carry() -> None:
    assert dl.dlq_topic("billing") == "%DLQ%billing"
    assert dl.dlq_topic_problem("billing") is None
    longest = "g" * (127 - len("%DLQ%"))
    assert dl.dlq_topic_problem(longest) is None
    too_long = dl.dlq_topic_problem(longest + "g")
    assert too_long is not None and "at most 122" in too_long
    bad_chars = dl.dlq_topic_problem("team a/billing")
    assert bad_chars is not None and "'team a/billing'" in bad_chars
