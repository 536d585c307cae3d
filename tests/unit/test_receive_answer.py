"""A receive's answer, framed by hand on the wire: what a client parses is the
ReceiveMessageResponse the generated classes would build, handles included."""

from __future__ import annotations

import pytest

from tidemq.protos import broker_pb2
from tidemq.services.broker.convert import to_proto
from tidemq.services.broker.receive.answer import ReceiveAnswer, varint
from tidemq.services.broker.receive.handle import HandleWriter, ReceiptHandle
from tidemq.storage import StoredMessage

pytestmark = pytest.mark.unit

UNTIL = 1_700_000_060_000
HOST = (b"\x7f\x00\x00\x01", 10911)


def stored(offset: int, body: bytes, properties: dict[str, str]) -> StoredMessage:
    return StoredMessage(
        "orders", 2, offset, 4096 * offset, 200 + len(body), body, 0, 0, 0,
        1_700_000_000_000, (b"\x0a\x00\x00\x05", 40000), 1_700_000_000_007, HOST, 0, 0,
        properties,
    )  # fmt: skip


MESSAGES = [
    (stored(7, b"plain", {}), 1),
    (stored(8, b"x" * 300, {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}), 1),
    (stored(9, b"", {"__SHARDINGKEY": "client-42", "p": "v"}), 3),
    (stored(300, "ü".encode() * 200, {"__SHARDINGKEY": "g"}), 16),
]


def test_the_framed_answer_is_the_generated_messages_answer() -> None:
    writer = HandleWriter("broker-a", "workers", "orders")
    answer = ReceiveAnswer(writer, UNTIL)
    want = broker_pb2.ReceiveMessageResponse()
    for m, attempt in MESSAGES:
        answer.add(m, m.queue_offset, attempt, 5_000)
        r = want.messages.add(
            receipt_handle=writer.encode(2, m.queue_offset, 5_000, UNTIL),
            delivery_attempt=attempt,
            invisible_until_ms=UNTIL,
            message_group=m.properties.get("__SHARDINGKEY", ""),
        )
        r.message.CopyFrom(to_proto(m))
        r.message.reconsume_times = attempt - 1
    got = broker_pb2.ReceiveMessageResponse.FromString(answer.encoded)
    assert got == want
    assert (answer.count, answer.redelivered) == (4, 2)
    h = ReceiptHandle.decode(got.messages[2].receipt_handle)
    assert h == ReceiptHandle("broker-a", "workers", "orders", 2, 9, 5_000, UNTIL)
    assert got.messages[3].message.reconsume_times == 15


def test_an_empty_answer_is_empty_on_the_wire() -> None:
    answer = ReceiveAnswer(HandleWriter("b", "g", "t"), UNTIL)
    assert answer.encoded == b""
    assert broker_pb2.ReceiveMessageResponse.FromString(answer.encoded).messages == []


def test_varint_is_protobufs() -> None:
    for v in (0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**63 - 1):
        m = broker_pb2.ReceivedMessage(invisible_until_ms=v)
        assert m.SerializeToString() == (b"\x20" + varint(v) if v else b"")
