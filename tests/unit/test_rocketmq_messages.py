"""Message conversion of the RocketMQ 5 (apache.rocketmq.v2) adapter, both ways, with golden
values: a client's message as ours (id, group, delivery time, GZIP, refusals), ours as the clients
read it (id, type, timestamps, hosts, digest, handle, attempt, dead-letter origin)."""

from __future__ import annotations

import gzip
import hashlib

import pytest
from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.services.broker.rocketmq import messages
from tidemq.services.broker.rocketmq.status import StatusError

pytestmark = pytest.mark.unit

# ---------------------------------------------------------------- messages: client -> ours

MAX_BODY = 4 << 20


def client_message(**system: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="orders"), body=b"hello")
    m.system_properties.message_id = "01AABBCCDDEEFF000100000001"
    m.system_properties.message_type = v2.NORMAL
    m.system_properties.body_encoding = v2.IDENTITY
    m.system_properties.born_timestamp.seconds = 1_700_000_000
    for k, v in system.items():
        if isinstance(v, timestamp_pb2.Timestamp):
            getattr(m.system_properties, k).CopyFrom(v)
        elif isinstance(v, list):
            getattr(m.system_properties, k).extend(v)
        else:
            setattr(m.system_properties, k, v)
    return m


def test_a_normal_message_keeps_topic_body_tag_keys_properties_and_id() -> None:
    m = client_message(tag="TagA", keys=["order-1", "user-42"])
    m.user_properties["source"] = "smoke"
    out = messages.to_ours(m, MAX_BODY)
    assert out.message == common_pb2.Message(
        topic="orders",
        body=b"hello",
        tag="TagA",
        keys=["order-1", "user-42"],
        properties={"source": "smoke", "UNIQ_KEY": "01AABBCCDDEEFF000100000001"},
        born_timestamp_ms=1_700_000_000_000,
    )
    assert (out.message_id, out.message_type, out.message_group) == (
        "01AABBCCDDEEFF000100000001",
        v2.NORMAL,
        "",
    )


def test_a_fifo_message_carries_its_group_as_the_sharding_key() -> None:
    out = messages.to_ours(client_message(message_type=v2.FIFO, message_group="g1"), MAX_BODY)
    assert out.message.properties["__SHARDINGKEY"] == "g1"
    assert out.message_group == "g1"


def test_a_delayed_message_is_delivered_at_its_timestamp() -> None:
    at = timestamp_pb2.Timestamp(seconds=1_800_000_000, nanos=250_000_000)
    out = messages.to_ours(client_message(message_type=v2.DELAY, delivery_timestamp=at), MAX_BODY)
    assert out.message.deliver_at_ms == 1_800_000_000_250


@pytest.mark.parametrize(
    ("system", "code"),
    [
        # Seconds a Timestamp holds but milliseconds of an int64 do not.
        (
            {
                "message_type": v2.DELAY,
                "delivery_timestamp": timestamp_pb2.Timestamp(seconds=9_223_372_036_854_776),
            },
            v2.ILLEGAL_DELIVERY_TIME,
        ),
        (
            {"born_timestamp": timestamp_pb2.Timestamp(seconds=9_223_372_036_854_776)},
            v2.BAD_REQUEST,
        ),
    ],
)
def test_a_timestamp_beyond_what_milliseconds_hold_is_a_typed_status(
    system: dict[str, object], code: int
) -> None:
    with pytest.raises(StatusError) as e:
        messages.to_ours(client_message(**system), MAX_BODY)
    assert e.value.code == code
    assert "out of range" in str(e.value)


def test_a_gzip_body_is_stored_inflated() -> None:
    m = client_message(body_encoding=v2.GZIP)
    m.body = gzip.compress(b"x" * 1000)
    assert messages.to_ours(m, MAX_BODY).message.body == b"x" * 1000


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: setattr(m, "body", b"not gzip at all"), v2.MESSAGE_CORRUPTED),
        (lambda m: setattr(m, "body", gzip.compress(b"x" * 5000)[:-12]), v2.MESSAGE_CORRUPTED),
        (lambda m: setattr(m, "body", gzip.compress(b"\0" * 20_000)), v2.MESSAGE_BODY_TOO_LARGE),
    ],
)
def test_a_corrupt_or_oversized_gzip_body_is_refused(change: object, code: int) -> None:
    m = client_message(body_encoding=v2.GZIP)
    change(m)  # type: ignore[operator]
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, 10_000)
    assert e.value.code == code


@pytest.mark.parametrize(
    ("system", "user", "code"),
    [
        ({"message_type": v2.FIFO}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_group": "g"}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.DELAY}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.LITE}, {}, v2.UNSUPPORTED),
        ({"tag": "a|b"}, {}, v2.ILLEGAL_MESSAGE_TAG),
        ({"tag": " "}, {}, v2.ILLEGAL_MESSAGE_TAG),
        ({"keys": [""]}, {}, v2.ILLEGAL_MESSAGE_KEY),
        ({"message_id": "x" * 200}, {}, v2.ILLEGAL_MESSAGE_ID),
        ({}, {"UNIQ_KEY": "forged"}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({}, {"__SHARDINGKEY": "g"}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"body_encoding": 7}, {}, v2.BAD_REQUEST),
    ],
)
def test_what_the_protocol_refuses_is_a_typed_status(
    system: dict[str, object], user: dict[str, str], code: int
) -> None:
    m = client_message(**system)
    m.user_properties.update(user)
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == code


def test_an_empty_body_and_a_wrong_digest_are_refused() -> None:
    m = client_message()
    m.body = b""
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == v2.MESSAGE_BODY_EMPTY
    m = client_message()
    m.system_properties.body_digest.type = v2.MD5
    m.system_properties.body_digest.checksum = "00" * 16
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == v2.MESSAGE_CORRUPTED
    m.system_properties.body_digest.checksum = hashlib.md5(b"hello").hexdigest()  # lower case
    assert messages.to_ours(m, MAX_BODY).message.body == b"hello"


# ---------------------------------------------------------------- messages: ours -> client


def stored(**fields: object) -> common_pb2.StoredMessage:
    base: dict[str, object] = {
        "topic": "orders",
        "queue_id": 3,
        "queue_offset": 41,
        "body": b"hello",
        "tag": "TagA",
        "keys": ["order-1"],
        "properties": {"UNIQ_KEY": "01AB", "source": "smoke", "PRODUCER_SEQ": "4"},
        "msg_id": "7F00000100002A9F0000000000000000",
        "born_timestamp_ms": 1_700_000_000_123,
        "store_timestamp_ms": 1_700_000_000_456,
        "born_host": "10.1.2.3:5555",
        "store_host": "127.0.0.1:10911",
    }
    base.update(fields)
    return common_pb2.StoredMessage(**base)


def test_a_received_message_is_what_the_clients_read() -> None:
    received = broker_pb2.ReceivedMessage(message=stored(), receipt_handle="h1", delivery_attempt=2)
    out = messages.received_to_v2(received)
    sp = out.system_properties
    assert out.topic.name == "orders"
    assert out.body == b"hello"
    assert dict(out.user_properties) == {"source": "smoke"}
    assert sp.message_id == "01AB"
    assert sp.message_type == v2.NORMAL
    assert sp.tag == "TagA"
    assert list(sp.keys) == ["order-1"]
    assert (sp.born_timestamp.seconds, sp.born_timestamp.nanos) == (1_700_000_000, 123_000_000)
    assert (sp.store_timestamp.seconds, sp.store_timestamp.nanos) == (1_700_000_000, 456_000_000)
    assert sp.born_host == "10.1.2.3"
    assert sp.store_host == "127.0.0.1:10911"
    assert (sp.queue_id, sp.queue_offset) == (3, 41)
    assert sp.receipt_handle == "h1"
    assert sp.delivery_attempt == 2
    assert sp.body_encoding == v2.IDENTITY
    assert sp.body_digest.type == v2.MD5
    assert sp.body_digest.checksum == "5D41402ABC4B2A76B9719D911017C592"  # md5("hello")


def test_message_id_falls_back_to_ours_and_types_are_inferred() -> None:
    m = messages.stored_to_v2(stored(properties={}))
    assert m.system_properties.message_id == "7F00000100002A9F0000000000000000"
    fifo = messages.stored_to_v2(stored(properties={"__SHARDINGKEY": "g1"}))
    assert fifo.system_properties.message_type == v2.FIFO
    assert fifo.system_properties.message_group == "g1"
    delayed = messages.stored_to_v2(stored(properties={"TIMER_DELIVER_MS": "1800000000250"}))
    assert delayed.system_properties.message_type == v2.DELAY
    assert delayed.system_properties.delivery_timestamp.seconds == 1_800_000_000
    half = messages.stored_to_v2(stored(properties={"TRAN_MSG": "true", "PGROUP": "orders"}))
    assert half.system_properties.message_type == v2.TRANSACTION
    assert dict(half.user_properties) == {}


def test_a_dead_letter_names_its_original_topic_and_id() -> None:
    props = {"RETRY_TOPIC": "orders", "ORIGIN_MESSAGE_ID": "01AB", "UNIQ_KEY": "01AB"}
    m = messages.stored_to_v2(stored(topic="%DLQ%g", properties=props))
    assert m.system_properties.dead_letter_queue.topic == "orders"
    assert m.system_properties.dead_letter_queue.message_id == "01AB"
