"""The client's record codec (``tidemq.protos.record_blocks`` and its compiled twin ``_crecords``):
the sent block's golden bytes, a block filled by the broker being exactly what the message path
stores, send results naming the offsets the records really got, pulled records decoding to what
``ReceivedMessage.from_proto(to_proto(...))`` gives, and the twins agreeing (results and errors)
on random input.

``_crecords`` is imported directly: a machine that should have built it and did not fails here.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.record_blocks import sent_block
from tidemq.protos import _crecords, broker_pb2, record_blocks
from tidemq.protos.record_blocks import (
    MAX_PROPERTIES_BYTES,
    RecordFormatError,
    encode_send_request,
)
from tidemq.services.broker.convert import to_proto
from tidemq.services.broker.idempotence.stamp import encode_stamp_property
from tidemq.storage import MessageStore, SentBlock, StoreConfig
from tidemq.storage.record import (
    HEADERS,
    MAGIC_V2,
    Message,
    StoredMessage,
    decode_record,
    encode_record,
)
from tidemq.storage.record import make_msg_id as storage_msg_id
from tidemq.storage.record.block import FilledBlock, fill_block, filled_size_bound
from tidemq.types import ReceivedMessage, SendResult, SendStatus

pytestmark = pytest.mark.unit

BlockMessage = tuple[bytes, str | None, Sequence[str], Mapping[str, str] | None, int]


class Codec(NamedTuple):
    encode_block: Callable[..., bytes]
    check_message: Callable[..., None]
    block_results: Callable[..., list[Any]]
    decode_records: Callable[..., list[Any]]
    make_msg_id: Callable[..., str]


PY = Codec(
    record_blocks.py_encode_block,
    record_blocks.py_check_message,
    record_blocks.py_block_results,
    record_blocks.py_decode_records,
    record_blocks.py_make_msg_id,
)
C = Codec(
    _crecords.encode_block,
    _crecords.check_message,
    _crecords.block_results,
    _crecords.decode_records,
    _crecords.make_msg_id,
)
CODECS = [pytest.param(PY, id="python"), pytest.param(C, id="c")]

TOPIC = "Orders"
QUEUE = 2
STORE_HOST = (b"\x0a\x00\x00\x05", 10911)
BORN_HOST = (b"\x7f\x00\x00\x01", 5555)
V6_HOST = (bytes.fromhex("20010db8000000000000000000000001"), 7000)
BROKER = "broker-a"
# What a pull's answer gives every message (tidemq.consumer.pulling).
COMMON = {
    "broker": BROKER,
    "receipt_handle": "",
    "delivery_attempt": 0,
    "message_group": None,
    "invisible_until_ms": 0,
}
# SendResult's per-record fields, as the producer names them.
AT = (
    SendResult._fields.index("msg_id"),
    SendResult._fields.index("queue_offset"),
    SendResult._fields.index("commitlog_offset"),
)
TEMPLATE = SendResult(SendStatus.SEND_OK, "", QUEUE, 0, BROKER, TOPIC, 0, 3, "10.0.0.5:10911")

GOLDEN_MESSAGES: list[BlockMessage] = [
    (
        "hello, 世界".encode(),
        "paid",
        ("order-1", "customer-9"),
        {"trace": "t-1", "région": "Île-de-France"},
        1_700_000_000_000,
    ),
    (b"", "", (), None, 0),
    (b"x", "标签", ("k",), None, 5),
]
GOLDEN = bytes.fromhex(
    # record 0: 177 bytes
    "000000b1 daa320a7 00000000 00000002 00000000"  # TOTALSIZE, MAGIC V1, BODYCRC, QUEUEID, FLAG
    "0000000000000000 0000000000000000 00000000"  # QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
    "0000018bcfe56800"  # BORNTIMESTAMP 1_700_000_000_000
    "0000000000000000 0000000000000000 0000000000000000"  # BORNHOST, STORETIMESTAMP, STOREHOST
    "00000000 0000000000000000"  # RECONSUMETIMES, PREPARED TRANSACTION OFFSET
    "0000000d 68656c6c6f2c20e4b896e7958c"  # BODY LENGTH 13, "hello, 世界"
    "06 4f7264657273"  # TOPIC LENGTH, "Orders"
    "0043"  # PROPERTIES LENGTH 67: the message's own in order, then TAGS, then KEYS
    "7472616365 01 742d31 02"  # trace = t-1
    "72c3a967696f6e 01 c38e6c652d64652d4672616e6365 02"  # région = Île-de-France
    "54414753 01 70616964 02"  # TAGS = paid
    "4b455953 01 6f726465722d31 20 637573746f6d65722d39 02"  # KEYS = order-1 customer-9
    # record 1: 97 bytes, nothing but the topic
    "00000061 daa320a7 00000000 00000002 00000000"
    "0000000000000000 0000000000000000 00000000"
    "0000000000000000"  # BORNTIMESTAMP 0: the broker's store timestamp
    "0000000000000000 0000000000000000 0000000000000000"
    "00000000 0000000000000000"
    "00000000"
    "06 4f7264657273"
    "0000"
    # record 2: 117 bytes
    "00000075 daa320a7 00000000 00000002 00000000"
    "0000000000000000 0000000000000000 00000000"
    "0000000000000005"
    "0000000000000000 0000000000000000 0000000000000000"
    "00000000 0000000000000000"
    "00000001 78"
    "06 4f7264657273"
    "0013"
    "54414753 01 e6a087e7adbe 02"  # TAGS = 标签
    "4b455953 01 6b 02"  # KEYS = k
)


def store_message(m: BlockMessage, queue_id: int = QUEUE) -> Message:
    """The same message as the broker's message path takes it."""
    body, tag, keys, props, born = m
    return Message(
        TOPIC, body, queue_id, tags=tag or None, keys=tuple(keys), properties=dict(props or {}),
        born_timestamp_ms=born, born_host=BORN_HOST,
    )  # fmt: skip


def fill(
    records: bytes,
    count: int,
    start: int,
    file_size: int,
    *,
    record_crc: bool = True,
    born_host: tuple[bytes, int] = BORN_HOST,
    store_host: tuple[bytes, int] = STORE_HOST,
    head: bytes = b"",
    first_queue_offset: int = 7,
    now_ms: int = 99,
    queue_id: int = QUEUE,
) -> tuple[FilledBlock, dict[int, bytes]]:
    """The broker's fill of a sent block: its answer and the stored bytes by log offset."""
    out = bytearray(
        filled_size_bound(
            len(records), count, len(born_host[0]) == 16, len(store_host[0]) == 16, record_crc,
            len(head),
        )
    )  # fmt: skip
    filled = fill_block(
        records, count, TOPIC, queue_id, start, file_size, first_queue_offset, now_ms, born_host,
        store_host, 4 << 20, record_crc, out, 0, head,
    )  # fmt: skip
    stored = {at: bytes(out[o : o + n]) for at, o, n, fills_file in filled.spans if not fills_file}
    return filled, stored


def stored_records(stored: dict[int, bytes]) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    for data in stored.values():
        pos = 0
        while pos < len(data):
            m = decode_record(data, pos)
            out.append(m)
            pos += m.size
    return out


def results_of(
    codec: Codec, records: bytes, filled: FilledBlock, first_queue_offset: int,
    store_host: tuple[bytes, int] = STORE_HOST,
) -> list[SendResult]:  # fmt: skip
    return codec.block_results(
        SendResult, TEMPLATE, AT, records, first_queue_offset, filled.first_phy_offset,
        filled.added_bytes, filled.head_added_bytes, [i for i, _ in filled.file_starts],
        [at for _, at in filled.file_starts], store_host[0], store_host[1],
    )  # fmt: skip


def expected_received(record: bytes) -> dict[str, Any]:
    """What a pulled message is today: ``ReceivedMessage.from_proto(to_proto(stored))``."""
    return fields_of(ReceivedMessage.from_proto(to_proto(decode_record(record)), BROKER))


def as_v2(record: bytes) -> bytes:
    """A V1 record rewritten with the V2 magic (a 2-byte topic length)."""
    sys_flag = int.from_bytes(record[36:40], "big")
    hdr = HEADERS[bool(sys_flag & 0x10), bool(sys_flag & 0x20)]
    body_len = int.from_bytes(record[hdr.size - 4 : hdr.size], "big")
    at = hdr.size + body_len
    head = (len(record) + 1).to_bytes(4, "big") + MAGIC_V2.to_bytes(4, "big") + record[8:at]
    return head + b"\x00" + record[at:]


def with_properties(record: bytes, props: bytes) -> bytes:
    """A stored record whose properties are replaced by ``props`` (CRCs left stale: readers of
    pulled records check shape only)."""
    sys_flag = int.from_bytes(record[36:40], "big")
    hdr = HEADERS[bool(sys_flag & 0x10), bool(sys_flag & 0x20)]
    body_len = int.from_bytes(record[hdr.size - 4 : hdr.size], "big")
    props_len_at = hdr.size + body_len + 1 + record[hdr.size + body_len]
    head = record[:props_len_at]
    size = len(head) + 2 + len(props)
    return size.to_bytes(4, "big") + head[4:] + len(props).to_bytes(2, "big") + props


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """A call's result, or the class and text of the error it raised: the twins must agree on
    both. Any other exception fails the test."""
    try:
        result = fn(*args)
    except (RecordFormatError, TypeError) as e:
        return (type(e), str(e))
    if isinstance(result, list):
        return (
            "ok",
            [(type(r), fields_of(r) if hasattr(r, "__dataclass_fields__") else r) for r in result],
        )
    return ("ok", result)


# ================================================================================ the sent block
@pytest.mark.parametrize("codec", CODECS)
def test_a_block_with_tag_keys_properties_and_non_ascii_text_is_the_golden_bytes(
    codec: Codec,
) -> None:
    assert codec.encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES) == GOLDEN


def fields_of(m: Any) -> dict[str, Any]:
    """A decoded message's fields (ReceivedMessage keeps them in slots, not a __dict__)."""
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}


@pytest.mark.parametrize("codec", CODECS)
def test_a_block_is_what_the_message_path_stores_with_the_broker_fields_zeroed(
    codec: Codec,
) -> None:
    # Born timestamps not 0: the message path stores 0 as the store timestamp at once.
    msgs = [(b, t, k, p, born or 1) for b, t, k, p, born in GOLDEN_MESSAGES]
    assert codec.encode_block(TOPIC, QUEUE, msgs) == sent_block([store_message(m) for m in msgs])


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("record_crc", [True, False])
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_a_block_filled_by_the_broker_is_byte_for_byte_what_the_message_path_stores(
    codec: Codec, record_crc: bool, v6: bool
) -> None:
    born, store = (V6_HOST, V6_HOST) if v6 else (BORN_HOST, STORE_HOST)
    records = codec.encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES)
    _, stored = fill(
        records, 3, 5_000, 1 << 20, record_crc=record_crc, born_host=born, store_host=store
    )
    expected = []
    pos = 5_000
    for i, m in enumerate(GOLDEN_MESSAGES):
        msg = store_message(m)
        msg.born_host = born
        expected.append(encode_record(msg, 7 + i, pos, 99, store, record_crc=record_crc))
        pos += len(expected[-1])
    assert stored == {5_000: b"".join(expected)}


@pytest.mark.parametrize("codec", CODECS)
def test_properties_at_the_limit_still_fit_with_the_record_crc_and_the_widest_stamp(
    codec: Codec,
) -> None:
    widest_stamp = encode_stamp_property(2**63 - 1, 2**31 - 1, 2**63 - 1, 2**31 - 1)
    assert len(widest_stamp) == 65
    value = "v" * (MAX_PROPERTIES_BYTES - len("big\x01\x02"))
    msg: BlockMessage = (b"body", "", (), {"big": value}, 1)
    codec.check_message("", (), {"big": value})
    records = codec.encode_block(TOPIC, QUEUE, [msg])
    _, stored = fill(records, 1, 0, 1 << 20, head=widest_stamp)
    assert stored_records(stored)[0].properties["big"] == value
    with pytest.raises(RecordFormatError, match=f"at most {MAX_PROPERTIES_BYTES} allowed"):
        codec.encode_block(TOPIC, QUEUE, [(b"body", "", (), {"big": value + "v"}, 1)])


BAD_BLOCKS: list[tuple[str, Any, Any, type[Exception], str]] = [
    ("empty topic", "", [], RecordFormatError, "topic is empty"),
    ("long topic", "t" * 128, [], RecordFormatError, "topic is 128 bytes, at most 127 allowed"),
    ("topic bytes", "é" * 64, [], RecordFormatError, "topic is 128 bytes, at most 127 allowed"),
    ("topic chars", "a b", [], RecordFormatError, "topic 'a b' may hold only letters, digits"),
    ("topic newline", "orders\n", [], RecordFormatError, "topic 'orders\\n' may hold only"),
    ("topic type", b"t", [], TypeError, "topic must be str, not bytes"),
    ("no messages", TOPIC, [], RecordFormatError, "a block holds at least one message"),
    ("not a tuple", TOPIC, [[b"", "", (), None, 0]], TypeError, "message 0: not a (body"),
    ("body type", TOPIC, [("b", "", (), None, 0)], TypeError, "message 0: body must be bytes"),
    ("tag sep", TOPIC, [(b"", "a\x01", (), None, 0)], RecordFormatError,
     "message 0: tag 'a\\x01' holds \\x01 or \\x02"),
    ("tag type", TOPIC, [(b"", 7, (), None, 0)], TypeError, "message 0: tag must be str or None"),
    ("tag surrogate", TOPIC, [(b"", "\ud800", (), None, 0)], RecordFormatError,
     "message 0: tag '\\ud800' is not valid UTF-8 text"),
    ("keys str", TOPIC, [(b"", "", "k", None, 0)], TypeError,
     "message 0: keys must be a sequence of str, not str"),
    ("keys int", TOPIC, [(b"", "", 5, None, 0)], TypeError,
     "message 0: keys must be a sequence of str, not int"),
    ("empty key", TOPIC, [(b"", "", ("",), None, 0)], RecordFormatError,
     "message 0: a key is empty"),
    ("key space", TOPIC, [(b"", "", ("a b",), None, 0)], RecordFormatError,
     "message 0: key 'a b' holds a space, \\x01 or \\x02"),
    ("props type", TOPIC, [(b"", "", (), [("a", "b")], 0)], TypeError,
     "message 0: properties must be a mapping of str to str or None, not list"),
    ("empty name", TOPIC, [(b"", "", (), {"": "v"}, 0)], RecordFormatError,
     "message 0: a property name is empty"),
    ("name sep", TOPIC, [(b"", "", (), {"a\x02": "v"}, 0)], RecordFormatError,
     "message 0: property name 'a\\x02' holds \\x01 or \\x02"),
    ("value sep", TOPIC, [(b"", "", (), {"a": "\x01"}, 0)], RecordFormatError,
     "message 0: the value of property 'a' holds \\x01 or \\x02"),
    ("value type", TOPIC, [(b"", "", (), {"a": 1}, 0)], TypeError,
     "message 0: the value of property 'a' must be str, not int"),
    ("TAGS", TOPIC, [(b"", "", (), {"TAGS": "x"}, 0)], RecordFormatError,
     "message 0: property TAGS is reserved: the tag and keys set it"),
    ("KEYS", TOPIC, [(b"", "", (), {"KEYS": "x"}, 0)], RecordFormatError,
     "message 0: property KEYS is reserved: the tag and keys set it"),
    ("stamp", TOPIC, [(b"", "", (), {"PRODUCER_SEQ": "1.1.1"}, 0)], RecordFormatError,
     "message 0: property PRODUCER_SEQ is reserved for the broker"),
    ("crc", TOPIC, [(b"", "", (), {"__CRC32H": "1"}, 0)], RecordFormatError,
     "message 0: property __CRC32H is reserved for the broker"),
    ("legacy crc", TOPIC, [(b"", "", (), {"__CRC32#": "1"}, 0)], RecordFormatError,
     "message 0: property __CRC32# is reserved for the broker"),
    ("born negative", TOPIC, [(b"", "", (), None, -1)], RecordFormatError,
     "message 0: born timestamp -1 is out of range (0 to 2^63-1)"),
    ("born huge", TOPIC, [(b"", "", (), None, 2**63)], RecordFormatError,
     "message 0: born timestamp 9223372036854775808 is out of range"),
    ("born type", TOPIC, [(b"", "", (), None, 1.0)], TypeError,
     "message 0: born timestamp must be int, not float"),
]  # fmt: skip


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("topic", "messages", "error", "text"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_BLOCKS],
)
def test_a_bad_block_is_refused_with_an_error_naming_the_message_and_the_problem(
    codec: Codec, topic: Any, messages: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as refused:
        codec.encode_block(topic, QUEUE, messages)
    assert str(refused.value).startswith(text)
    assert issubclass(RecordFormatError, ValueError)


@pytest.mark.parametrize("codec", CODECS)
def test_queue_ids_outside_int32_are_refused_and_the_bad_message_is_named_by_its_index(
    codec: Codec,
) -> None:
    good: BlockMessage = (b"b", "t", ("k",), {"p": "v"}, 1)
    for queue_id in (-1, 2**31):
        with pytest.raises(RecordFormatError, match=f"queue id {queue_id} is out of range"):
            codec.encode_block(TOPIC, queue_id, [good])
    assert codec.encode_block(TOPIC, 2**31 - 1, [good])[12:16] == b"\x7f\xff\xff\xff"
    with pytest.raises(RecordFormatError, match=r"^message 2: key 'a\\x02' holds"):
        codec.encode_block(TOPIC, QUEUE, [good, good, (b"", None, ["a\x02"], None, 0)])


@pytest.mark.parametrize("codec", CODECS)
def test_arguments_may_be_passed_by_name(codec: Codec) -> None:
    assert codec.encode_block(topic=TOPIC, queue_id=QUEUE, messages=GOLDEN_MESSAGES) == GOLDEN
    codec.check_message(tag="t", keys=(), properties=None)
    assert codec.make_msg_id(STORE_HOST[0], store_port=STORE_HOST[1], commitlog_offset=9) == (
        storage_msg_id(STORE_HOST, 9)
    )
    results = codec.block_results(
        cls=SendResult, template=TEMPLATE, at=AT, records=GOLDEN, first_queue_offset=0,
        first_commitlog_offset=0, added_bytes=0, head_added_bytes=0, file_start_indexes=(),
        file_start_offsets=(), store_host=STORE_HOST[0], store_port=STORE_HOST[1],
    )  # fmt: skip
    assert [r.commitlog_offset for r in results] == [0, 177, 177 + 97]
    assert codec.decode_records(cls=ReceivedMessage, common=COMMON, records=GOOD)


@pytest.mark.parametrize("codec", CODECS)
def test_check_message_refuses_one_bad_message_alone_without_a_message_index(
    codec: Codec,
) -> None:
    codec.check_message("tag", ("k1", "k2"), {"trace": "t"})
    codec.check_message(None, [], None)
    with pytest.raises(RecordFormatError) as refused:
        codec.check_message("", (), {"KEYS": "k"})
    assert str(refused.value) == "property KEYS is reserved: the tag and keys set it"


# ================================================================================= send results
@pytest.mark.parametrize("codec", CODECS)
def test_send_results_name_the_offsets_and_ids_of_records_that_cross_a_file(
    codec: Codec,
) -> None:
    msgs: list[BlockMessage] = [(b"m%d" % i * 40, "t", (f"k{i}",), None, i) for i in range(12)]
    records = codec.encode_block(TOPIC, QUEUE, msgs)
    filled, stored = fill(records, len(msgs), 4096 - 700, 4096)
    assert filled.file_starts, "the block should cross into the next file"
    results = results_of(codec, records, filled, 7)
    got = stored_records(stored)
    assert [(r.queue_offset, r.commitlog_offset, r.msg_id) for r in results] == [
        (m.queue_offset, m.phy_offset, storage_msg_id(STORE_HOST, m.phy_offset)) for m in got
    ]
    assert all(type(r) is SendResult for r in results)
    assert {r._replace(msg_id="", queue_offset=0, commitlog_offset=0) for r in results} == {
        TEMPLATE
    }


@pytest.mark.parametrize("codec", CODECS)
def test_send_results_count_the_idempotence_stamp_of_the_head_and_ipv6_store_hosts(
    codec: Codec,
) -> None:
    records = codec.encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES)
    head = encode_stamp_property(0x1F, 3, 10, 3)
    filled, stored = fill(records, 3, 64, 1 << 20, store_host=V6_HOST, head=head)
    assert filled.head_added_bytes == len(head)
    results = results_of(codec, records, filled, 7, V6_HOST)
    assert [(r.queue_offset, r.commitlog_offset, r.msg_id) for r in results] == [
        (m.queue_offset, m.phy_offset, storage_msg_id(V6_HOST, m.phy_offset))
        for m in stored_records(stored)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_a_duplicate_too_old_to_remember_gets_no_offsets_and_an_empty_id(codec: Codec) -> None:
    records = codec.encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES)
    dup = TEMPLATE._replace(duplicate=True)
    results = codec.block_results(
        SendResult, dup, AT, records, -1, -1, 20, 0, [], [], STORE_HOST[0], STORE_HOST[1]
    )
    assert results == [dup._replace(queue_offset=-1, commitlog_offset=-1)] * 3


@pytest.mark.store
@pytest.mark.parametrize("codec", CODECS)
def test_a_block_put_in_a_real_store_is_where_its_results_say_and_pulls_back_as_today(
    codec: Codec, tmp_path: Path
) -> None:
    msgs: list[BlockMessage] = [
        (f"order {i} ".encode() * 9, f"t{i % 2}", (f"key-{i}",), {"n": str(i)} if i % 3 else None,
         5_000 + i)
        for i in range(20)
    ]  # fmt: skip
    records = codec.encode_block(TOPIC, QUEUE, msgs)
    store = MessageStore(StoreConfig(str(tmp_path), commitlog_file_size_bytes=4096)).open()
    try:
        store.put_messages([store_message(msgs[0])]).wait()  # the queue holds one already
        put = store.put_blocks([SentBlock(TOPIC, QUEUE, records, len(msgs), BORN_HOST)])
        put.dispatched.result(10)
        (p,) = put.placements
        assert p.file_starts, "the block should cross into the next file"
        results = codec.block_results(
            SendResult, TEMPLATE, AT, records, p.first_queue_offset, p.first_phy_offset,
            p.added_bytes, p.head_added_bytes, [i for i, _ in p.file_starts],
            [at for _, at in p.file_starts], put.store_host[0], put.store_host[1],
        )  # fmt: skip
        got = store.get_messages(TOPIC, QUEUE, 1, 64, max_bytes=1 << 20).messages
        assert [(r.queue_offset, r.commitlog_offset, r.msg_id) for r in results] == [
            (m.queue_offset, m.phy_offset, m.msg_id) for m in got
        ]
        pulled = b"".join(store.read_raw(m.phy_offset, m.size) for m in got)
        decoded = codec.decode_records(ReceivedMessage, COMMON, pulled)
        assert [fields_of(m) for m in decoded] == [
            fields_of(ReceivedMessage.from_proto(to_proto(m), BROKER)) for m in got
        ]
    finally:
        store.close()


@pytest.mark.parametrize("codec", CODECS)
def test_make_msg_id_is_storages_offset_id(codec: Codec) -> None:
    for host, offset in [(STORE_HOST, 0), (V6_HOST, 2**63 - 1), ((b"\xff" * 4, 65535), 4096)]:
        assert codec.make_msg_id(host[0], host[1], offset) == storage_msg_id(host, offset)
    with pytest.raises(RecordFormatError, match=r"not 4 \(IPv4\) or 16"):
        codec.make_msg_id(b"\x01\x02", 1, 0)
    with pytest.raises(RecordFormatError, match="commitlog offset -1 is out of range"):
        codec.make_msg_id(STORE_HOST[0], 1, -1)


# =============================================================================== pulled records
def stored_variants() -> list[bytes]:
    """Records as CommitLogs hold them: V1 and V2, IPv4 and IPv6 hosts, with and without the
    record CRC, with every kind of property a reader must drop or keep."""
    out: list[bytes] = []
    for i, (born, store) in enumerate(
        [(BORN_HOST, STORE_HOST), (V6_HOST, STORE_HOST), (BORN_HOST, V6_HOST), (V6_HOST, V6_HOST)]
    ):
        msg = Message(
            TOPIC, b"body-%d" % i, i, tags="tag-é" if i % 2 else None, keys=("k1", "k2")[: i % 3],
            properties={"UNIQ_KEY": f"u{i}", "PRODUCER_SEQ": "1f.3.a", "é": "ü"} if i else {},
            born_timestamp_ms=1_700_000_000_000 + i, born_host=born, reconsume_times=i,
        )  # fmt: skip
        record = encode_record(msg, 40 + i, 1000 * i, 1_700_000_000_500, store, record_crc=i < 2)
        out += (record, as_v2(record))
    plain = encode_record(Message(TOPIC, b"x"), 0, 77, 1, STORE_HOST)
    for props in [
        b"TAGS\x01\x02KEYS\x01 a  b \x02",  # an empty tag is none; empty keys are dropped
        b"TAGS\x01one\x02TAGS\x01two\x02x\x01\x02x\x01y\x02",  # the last of a name wins
        b"noseparator\x02\x01empty name\x02v\x01a\x01b\x02",  # no 0x01: skipped; a 2nd 0x01 kept
        b"bad\xff\xfeutf8\x01\xc3(\xe2\x82\x02KEYS\x01\xff k\x80\x02",  # replaced, not refused
        b"__CRC32#\x010123456789\x02",  # the legacy CRC: the broker's, never shown
    ]:
        out.append(with_properties(plain, props))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_pulled_records_decode_to_what_from_proto_of_to_proto_gives_for_every_field(
    codec: Codec,
) -> None:
    records = stored_variants()
    decoded = codec.decode_records(ReceivedMessage, COMMON, b"".join(records))
    assert [type(m) for m in decoded] == [ReceivedMessage] * len(records)
    assert [fields_of(m) for m in decoded] == [expected_received(r) for r in records]
    assert decoded[0] == ReceivedMessage.from_proto(to_proto(decode_record(records[0])), BROKER)
    assert decoded[0].properties is not decoded[1].properties  # each message its own dict


def _record(**fields: int) -> bytes:
    """A plain stored record (IPv4 hosts) with some header fields overwritten."""
    r = bytearray(encode_record(Message(TOPIC, b"x"), 0, 0, 1, STORE_HOST))
    offsets = {"size": 0, "magic": 4, "sys_flag": 36, "body_len": 84}
    for name, value in fields.items():
        r[offsets[name] : offsets[name] + 4] = value.to_bytes(4, "big", signed=value < 0)
    return bytes(r)


GOOD = _record()
BAD_RECORDS: list[tuple[str, bytes, str]] = [
    ("short", GOOD[:90], "record 0 at byte 0: 90 bytes left, fewer than the 91 of the smallest"),
    ("truncated", GOOD + GOOD[:-1], f"record 1 at byte {len(GOOD)}: size {len(GOOD)} runs past "
     f"the {len(GOOD) - 1} bytes left"),
    ("magic", _record(magic=0x12345678), "record 0 at byte 0: bad magic 0x12345678"),
    ("blank marker", _record(magic=0xCBD43194), "bad magic 0xCBD43194"),
    ("size", _record(size=-5), "record 0 at byte 0: size -5 is below the 91 of its fields"),
    ("v6 size", _record(sys_flag=0x30), f"size {len(GOOD)} is below the 115 of its fields"),
    ("body length", _record(body_len=-1), "body length -1 runs past the record"),
    ("body past", _record(body_len=40), "body length 40 runs past the record"),
    ("topic past", _record(body_len=0), "topic length 120 runs past the record"),
    ("properties", GOOD[:-2] + b"\x00\x05", "properties length 5 does not match the record's"),
    ("no 0x02", with_properties(GOOD, b"a\x01b"), "properties do not end with 0x02"),
    ("phy", GOOD[:28] + (2**64 - 1).to_bytes(8, "big") + GOOD[36:],
     "PHYSICALOFFSET -1 is negative"),
]  # fmt: skip


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("records", "text"), [pytest.param(*case[1:], id=case[0]) for case in BAD_RECORDS]
)
def test_malformed_pulled_records_are_refused_with_the_record_and_the_problem(
    codec: Codec, records: bytes, text: str
) -> None:
    with pytest.raises(RecordFormatError) as refused:
        codec.decode_records(ReceivedMessage, COMMON, records)
    assert text in str(refused.value)


@pytest.mark.parametrize("codec", CODECS)
def test_decode_records_refuses_classes_it_cannot_fill_without_their_init(codec: Codec) -> None:
    with pytest.raises(TypeError, match=r"^SendResult is not created by object\.__new__$"):
        codec.decode_records(SendResult, COMMON, GOOD)

    class Slotted:
        __slots__ = ("topic",)

    # A class whose fields are slots is filled slot by slot: it must have one for each value.
    with pytest.raises(TypeError, match="Slotted has neither a __dict__ nor a slot 'broker'"):
        codec.decode_records(Slotted, COMMON, GOOD)
    with pytest.raises(TypeError, match="common must be a dict"):
        codec.decode_records(ReceivedMessage, list(COMMON.items()), GOOD)
    assert codec.decode_records(ReceivedMessage, COMMON, b"") == []


# ============================================================================== implementations
def _implementation(env: dict[str, str], code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_compiled_codec_is_used_unless_tidemq_pure_python_is_set_or_it_is_not_built() -> None:
    code = "from tidemq.protos import record_blocks as r; print(r.IMPLEMENTATION)"
    env = {k: v for k, v in os.environ.items() if k != "TIDEMQ_PURE_PYTHON"}
    assert _implementation(env, code) == "c"
    assert _implementation({**env, "TIDEMQ_PURE_PYTHON": "1"}, code) == "python"
    unbuilt = "import sys; sys.modules['tidemq.protos._crecords'] = None\n" + code
    assert _implementation(env, unbuilt) == "python"
    # Imported on its own, the compiled module raises record_blocks' error class all the same.
    code = (
        "from tidemq.protos import _crecords\n"
        "try:\n    _crecords.encode_block('', 0, [])\n"
        "except ValueError as e:\n    print(type(e).__module__, type(e).__name__)"
    )
    assert _implementation(env, code) == "tidemq.protos.record_blocks RecordFormatError"


# =================================================================== the twins on random input
some = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Text a property may hold: any code point but the separators (surrogates cannot be UTF-8).
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x01\x02"))
tags = st.one_of(st.none(), st.just(""), text)
keys = st.lists(
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters=" \x01\x02"),
            min_size=1, max_size=8),
    max_size=3,
).map(tuple)  # fmt: skip
properties = st.one_of(
    st.none(),
    st.dictionaries(
        text.filter(lambda n: n != "" and n not in record_blocks.RESERVED_PROPERTIES),
        text,
        max_size=4,
    ),
)
messages = st.tuples(st.binary(max_size=64), tags, keys, properties, st.integers(0, 2**63 - 1))


@some
@given(st.lists(messages, min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_the_twins_encode_random_messages_alike_and_they_decode_back_as_sent(
    msgs: list[BlockMessage], queue_id: int
) -> None:
    records = PY.encode_block(TOPIC, queue_id, msgs)
    assert C.encode_block(TOPIC, queue_id, msgs) == records
    for _, tag, ks, props, _ in msgs:
        PY.check_message(tag, ks, props)
        C.check_message(tag, ks, props)
    _, stored = fill(records, len(msgs), 0, 1 << 30, queue_id=queue_id)
    pulled = stored[0]
    decoded = C.decode_records(ReceivedMessage, COMMON, pulled)
    assert [fields_of(m) for m in PY.decode_records(ReceivedMessage, COMMON, pulled)] == [
        fields_of(m) for m in decoded
    ]
    assert [(m.body, m.tag, m.keys, m.properties, m.born_timestamp_ms or 99) for m in decoded] == [
        (body, tag or None, ks, dict(props or {}), born or 99)
        for body, tag, ks, props, born in msgs
    ]


bad_text = st.sampled_from(["\x01", "a\x02", "\ud800", " ", "", "ok", "é"])
bad_values = st.one_of(bad_text, st.sampled_from([None, 5, b"x", ["a"], ("a", " b")]))
bad_messages = st.tuples(
    st.one_of(st.binary(max_size=8), st.sampled_from(["body", None])),
    st.one_of(tags, bad_values),
    st.one_of(keys, st.lists(bad_values, max_size=3), bad_values),
    st.one_of(
        properties,
        st.dictionaries(st.one_of(bad_text, st.sampled_from(["TAGS", "PRODUCER_SEQ", 3])),
                        bad_values, max_size=3),
        st.just({"big": "v" * MAX_PROPERTIES_BYTES}),
        st.dictionaries(bad_text, bad_text, max_size=3).map(MappingProxyType),
        bad_values,
    ),
    st.one_of(st.integers(-2, 2), st.sampled_from([2**63 - 1, 2**63, -(2**70), 1.5, "1"])),
)  # fmt: skip
bad_topics = st.one_of(
    st.just(TOPIC), st.sampled_from(["", "t" * 127, "t" * 128, "a b", "é", "\ud800", "%|_-", 5])
)


@some
@given(
    bad_topics,
    st.one_of(st.integers(-1, 3), st.sampled_from([2**31 - 1, 2**31, "0"])),
    st.lists(st.one_of(messages, bad_messages, st.sampled_from([(), [], None])), max_size=4),
)
def test_the_twins_refuse_random_invalid_input_with_the_same_error_class_and_text(
    topic: Any, queue_id: Any, msgs: list[Any]
) -> None:
    assert outcome(C.encode_block, topic, queue_id, msgs) == outcome(
        PY.encode_block, topic, queue_id, msgs
    )
    for m in msgs:
        if isinstance(m, tuple) and len(m) == 5:
            assert outcome(C.check_message, *m[1:4]) == outcome(PY.check_message, *m[1:4])


SENT = PY.encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES * 2)
offsets = st.one_of(st.integers(-3, 1 << 40), st.sampled_from([2**63 - 1, 2**63, -(2**63)]))


@some
@given(
    st.one_of(st.just(SENT), st.binary(max_size=300), st.just(SENT[:-3])),
    offsets,
    offsets,
    st.one_of(st.integers(0, 64), st.sampled_from([-1, 2**31])),
    st.one_of(st.integers(0, 64), st.sampled_from([-1, 2**31])),
    st.lists(st.integers(-1, 7), max_size=3),
    st.lists(offsets, max_size=3),
    st.sampled_from([STORE_HOST[0], V6_HOST[0], b"\x01"]),
    st.sampled_from([0, 10911, -1, 2**31]),
    st.sampled_from([AT, (0, 1, 1), (1, 2, 99)]),
)
def test_the_twins_derive_the_same_send_results_and_errors_from_random_answers(
    records: bytes, first_qoff: int, first_coff: int, added: int, head: int, starts: list[int],
    start_offsets: list[int], host: bytes, port: int, at: tuple[int, int, int],
) -> None:  # fmt: skip
    args = (SendResult, TEMPLATE, at, records, first_qoff, first_coff, added, head, starts,
            start_offsets, host, port)  # fmt: skip
    assert outcome(C.block_results, *args) == outcome(PY.block_results, *args)


STREAM = b"".join(stored_variants())


@some
@given(
    st.one_of(
        st.binary(max_size=400),
        st.tuples(
            st.integers(0, len(STREAM)),
            st.lists(st.tuples(st.integers(0, len(STREAM) - 1), st.integers(0, 255)), max_size=8),
        ).map(
            lambda cut: bytes(
                b if not (hit := [v for at, v in cut[1] if at == i]) else hit[-1]
                for i, b in enumerate(STREAM[: cut[0]])
            )
        ),
    )
)
def test_decoding_random_or_damaged_records_never_crashes_and_the_twins_agree(
    records: bytes,
) -> None:
    got = outcome(C.decode_records, ReceivedMessage, COMMON, records)
    assert got == outcome(PY.decode_records, ReceivedMessage, COMMON, records)
    assert got[0] in ("ok", RecordFormatError)


def test_a_send_request_encoded_by_hand_is_what_protobuf_reads_back() -> None:
    head = broker_pb2.SendMessageRequest(
        producer_group="g", epoch=3, producer_id=7, producer_epoch=2, block_topic="Orders"
    )
    blocks = [(0, b"\x01" * 300, 2, 0), (5, b"\x02" * 70_000, 1, 1 << 40)]
    encoded = encode_send_request(head.SerializeToString(), blocks)
    expected = broker_pb2.SendMessageRequest()
    expected.CopyFrom(head)
    for q, records, count, seq in blocks:
        expected.blocks.add(queue_id=q, records=records, count=count, first_sequence=seq)
    assert broker_pb2.SendMessageRequest.FromString(encoded) == expected
    # The golden form of one small block: the head, then field 8 holding its four fields.
    small = encode_send_request(b"", [(1, b"ab", 3, 4)])
    assert small.hex() == "420a" + "0801" + "1803" + "2004" + "12026162"
