"""Golden bytes of the CommitLog record layout (spec §1.2) and its limits."""

import struct
import zlib

import pytest

from tidemq.storage.errors import (
    BodyTooLargeError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidQueueIdError,
    InvalidTopicError,
    PropertiesTooLargeError,
)
from tidemq.storage.record import (
    CORRUPT,
    END_OF_FILE,
    INCOMPLETE,
    MAGIC_V1,
    OK,
    Message,
    RecordInfo,
    check_record,
    decode_record,
    encode_record,
    make_msg_id,
    parse_msg_id,
    read_record,
    write_blank,
)

pytestmark = pytest.mark.unit

BODY = b"Once, there was a chance for me!"  # RocketMQ's test body: 32 bytes
HOST = (bytes([127, 0, 0, 1]), 10911)


def test_fixed_overhead_is_91_bytes_so_foobar_with_32_byte_body_and_no_properties_is_129() -> None:
    rec = encode_record(Message("FooBar", BODY), 0, 0, 1, HOST)
    assert len(BODY) == 32
    assert len(rec) == 91 + 32 + 6 == 129


def test_rocketmq_test_message_is_158_bytes() -> None:
    # DefaultMessageStoreTest's message: TAGS=TAG1 and a 13-digit millisecond timestamp as KEYS.
    # The 158 of spec §1.2 is this record: 91 + 32 + 6 + len("TAGS\1TAG1\2KEYS\1<13 digits>\2").
    rec = encode_record(Message("FooBar", BODY, tags="TAG1", keys=["1700000000000"]), 0, 0, 1, HOST)
    assert len(rec) == 158


def test_golden_bytes_of_every_field() -> None:
    msg = Message(
        "FooBar",
        BODY,
        queue_id=3,
        flag=7,
        tags="TAG1",
        born_timestamp_ms=1_700_000_000_000,
        born_host=(bytes([10, 0, 0, 2]), 5555),
        reconsume_times=2,
    )
    rec = encode_record(
        msg, queue_offset=42, phy_offset=4096, store_timestamp_ms=1_700_000_000_123, store_host=HOST
    )
    props = b"TAGS\x01TAG1\x02"
    crc = zlib.crc32(BODY) & 0x7FFFFFFF
    expected = (
        struct.pack(">i", 129 + len(props))
        + bytes.fromhex("DAA320A7")
        + struct.pack(">iiiqqiq", crc, 3, 7, 42, 4096, 0, 1_700_000_000_000)
        + bytes([10, 0, 0, 2])
        + struct.pack(">i", 5555)
        + struct.pack(">q", 1_700_000_000_123)
        + bytes([127, 0, 0, 1])
        + struct.pack(">i", 10911)
        + struct.pack(">iqi", 2, 0, 32)
        + BODY
        + b"\x06FooBar"
        + struct.pack(">h", len(props))
        + props
    )
    assert rec == expected


def test_ipv6_hosts_add_12_bytes_each_and_set_sysflags() -> None:
    v6 = (bytes(15) + b"\x01", 9)
    rec = encode_record(Message("t", b"x", born_host=v6), 0, 0, 1, v6)
    assert len(rec) == 91 + 24 + 1 + 1
    decoded = decode_record(rec)
    assert decoded.sys_flag & 0x30 == 0x30
    assert decoded.born_host == v6 and decoded.store_host == v6
    assert decoded.body == b"x"


def test_decode_round_trip() -> None:
    msg = Message(
        "orders",
        b"payload",
        queue_id=1,
        tags="created",
        keys=["a", "b"],
        properties={"UNIQ_KEY": "U1", "custom": "v"},
    )
    rec = encode_record(msg, 5, 777, 99, HOST)
    m = decode_record(rec)
    assert (m.topic, m.queue_id, m.queue_offset, m.phy_offset) == ("orders", 1, 5, 777)
    assert m.tags == "created" and m.keys == ["a", "b"]
    assert m.properties["UNIQ_KEY"] == "U1" and m.properties["custom"] == "v"
    assert m.msg_id == make_msg_id(HOST, 777)


def test_check_record_reports_each_failure_kind() -> None:
    rec = bytearray(encode_record(Message("t", b"hello", keys=["k"]), 0, 100, 1, HOST))
    status, info = check_record(rec, 0, len(rec), True, 100)
    assert status == OK and isinstance(info, RecordInfo) and info.keys == b"k"
    assert check_record(rec, 0, len(rec) - 1, True, 100)[0] == INCOMPLETE  # torn
    assert check_record(bytes(64), 0, 64, True, 0)[0] == INCOMPLETE  # zeros: end of data
    assert check_record(rec, 0, len(rec), True, 200)[0] == CORRUPT  # stale record elsewhere
    flipped = bytearray(rec)
    flipped[88] ^= 0x01  # first body byte
    assert check_record(flipped, 0, len(flipped), True, 100) == (CORRUPT, "body CRC mismatch")
    assert check_record(flipped, 0, len(flipped), False, 100)[0] == OK  # CRC not asked for
    blank = bytearray(8)
    write_blank(blank, 0, 500)
    assert blank == struct.pack(">i", 500) + bytes.fromhex("CBD43194")
    assert check_record(blank, 0, 8, True, 0) == (END_OF_FILE, None)
    bad = bytearray(rec)
    bad[4:8] = b"\x12\x34\x56\x78"
    assert check_record(bad, 0, len(bad), True, 100)[0] == CORRUPT


@pytest.mark.parametrize("record_crc", [False, True])
def test_read_record_decodes_what_check_record_accepts_and_names_what_it_refuses(
    record_crc: bool,
) -> None:
    msg = Message("t", b"hello", tags="x", keys=["k"], properties={"p": "v"})
    rec = encode_record(msg, 3, 100, 1, HOST, record_crc=record_crc)
    assert read_record(rec, 0, len(rec), 100, record_crc) == decode_record(rec)
    flipped = bytearray(rec)
    flipped[88] ^= 0x01  # first body byte: the body CRC vouches for the body either way
    assert check_record(flipped, 0, len(flipped), True, 100) == (CORRUPT, "body CRC mismatch")
    assert read_record(flipped, 0, len(flipped), 100, record_crc) == "body CRC mismatch"
    assert "PHYSICALOFFSET" in str(read_record(rec, 0, len(rec), 200, record_crc))
    assert "bytes left" in str(read_record(rec, 0, 4, 100, record_crc))
    if not record_crc:
        assert read_record(rec, 0, len(rec), 100, True) == "record CRC property missing"


def test_magic_constant() -> None:
    assert struct.unpack(">i", struct.pack(">I", MAGIC_V1))[0] == -626843481


def test_msg_id_is_host_port_offset_in_uppercase_hex() -> None:
    msg_id = make_msg_id(HOST, 0x1234)
    assert msg_id == "7F00000100002A9F0000000000001234"
    assert parse_msg_id(msg_id) == (HOST, 0x1234)
    with pytest.raises(InvalidMessageIdError):
        parse_msg_id("zz")
    with pytest.raises(InvalidMessageIdError):
        parse_msg_id("00" * 10)
    for port, offset in [(-1, 0), (65_536, 0), (80, -1)]:
        with pytest.raises(InvalidMessageIdError):
            parse_msg_id((HOST[0] + struct.pack(">iq", port, offset)).hex())


@pytest.mark.parametrize(
    ("topic", "ok"),
    [
        ("orders", True),
        ("%RETRY%g", True),
        ("a|b-c_d", True),
        ("x" * 127, True),
        ("x" * 128, False),
        ("", False),
        ("bad topic", False),
        ("tópico", False),
        ("a/b", False),
        ("orders\n", False),  # a regular expression's "$" would let the newline through
    ],
)
def test_topic_rules(topic: str, ok: bool) -> None:
    if ok:
        encode_record(Message(topic, b""), 0, 0, 1, HOST)
    else:
        with pytest.raises(InvalidTopicError):
            encode_record(Message(topic, b""), 0, 0, 1, HOST)


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (Message("t", b"x" * 11), BodyTooLargeError),
        (Message("t", b"", properties={"p": "v" * 32_767}), PropertiesTooLargeError),
        (Message("t", b"", properties={"p": "a\x01b"}), InvalidPropertyError),
        (Message("t", b"", tags="a\x02b"), InvalidPropertyError),
        (Message("t", b"", keys=["has space"]), InvalidPropertyError),
        (Message("t", b"", keys=[""]), InvalidPropertyError),
        (Message("t", b"", properties={"__CRC32H": "0123456789"}), InvalidPropertyError),
        (Message("t", b"", properties={"__CRC32#": "0123456789"}), InvalidPropertyError),
        (Message("t", b"", queue_id=-1), InvalidQueueIdError),
        (Message("t", b"", queue_id=1 << 31), InvalidQueueIdError),
        (Message("t", b"", flag=1 << 31), InvalidPropertyError),
        (Message("t", b"", reconsume_times=-(1 << 31) - 1), InvalidPropertyError),
        (Message("t", b"", born_timestamp_ms=-1), InvalidPropertyError),
        (Message("t", b"", born_timestamp_ms=1 << 63), InvalidPropertyError),
        (Message("t", b"", prepared_transaction_offset=-1), InvalidPropertyError),
        (Message("t", b"", born_host=(b"\x7f\x00\x00", 1)), InvalidPropertyError),
        (Message("t", b"", born_host=(b"\x7f\x00\x00\x01", 65_536)), InvalidPropertyError),
    ],
)
def test_limits_refuse_with_typed_errors(msg: Message, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_record(msg, 0, 0, 1, HOST, max_body_bytes=10, record_crc=True)


def test_limits_are_inclusive() -> None:
    encode_record(Message("t", b"x" * 10), 0, 0, 1, HOST, max_body_bytes=10)
    props = {"p": "v" * (32_767 - 4)}  # "p" 0x01 value 0x02: exactly 32,767 bytes
    encode_record(Message("t", b"", properties=props), 0, 0, 1, HOST)
    with pytest.raises(PropertiesTooLargeError):  # the record CRC needs 20 of them
        encode_record(Message("t", b"", properties=props), 0, 0, 1, HOST, record_crc=True)


def test_record_crc_property_layout() -> None:
    rec = encode_record(Message("FooBar", BODY), 0, 0, 1, HOST, record_crc=True)
    assert len(rec) == 129 + 20
    tail = rec[-20:]
    assert tail[:9] == b"__CRC32H\x01" and tail[-1:] == b"\x02"
    body_at = 88
    covered = rec[body_at + len(BODY) : -11] + rec[:body_at]  # topic .. name 0x01, then header
    crc = zlib.crc32(covered) & 0x7FFFFFFF
    assert tail[9:19] == b"%010d" % crc  # most significant digit first
    assert struct.unpack_from(">h", rec, len(rec) - 22)[0] == 20  # it is a property like others
    assert "__CRC32H" not in decode_record(rec).properties


def _with_legacy_crc(msg: Message) -> bytes:
    """The record as earlier tidemq builds wrote it: RocketMQ's whole-record __CRC32# property."""
    rec = bytearray(encode_record(msg, 0, 0, 1, HOST, record_crc=True))
    rec[-20:-11] = b"__CRC32#\x01"
    crc = zlib.crc32(rec[:-20]) & 0x7FFFFFFF
    rec[-11:-1] = str(crc)[::-1].ljust(10, "0").encode()  # least significant digit first
    return bytes(rec)


def test_legacy_whole_record_crc_is_still_checked() -> None:
    rec = _with_legacy_crc(Message("FooBar", BODY, tags="TAG1"))
    assert check_record(rec, 0, len(rec), True, 0, require_record_crc=True)[0] == OK
    assert "__CRC32#" not in decode_record(rec).properties
    for at in range(8, len(rec)):
        damaged = bytearray(rec)
        damaged[at] ^= 0x20
        status, _ = check_record(damaged, 0, len(damaged), True, 0, require_record_crc=True)
        assert status != OK, f"a flipped byte at {at} went unnoticed"


def test_record_crc_catches_damage_in_any_byte_the_body_crc_misses() -> None:
    rec = encode_record(Message("FooBar", BODY, tags="TAG1"), 0, 0, 1, HOST, record_crc=True)
    for at in range(8, len(rec)):
        damaged = bytearray(rec)
        damaged[at] ^= 0x20
        status, _ = check_record(damaged, 0, len(damaged), True, 0, require_record_crc=True)
        assert status != OK, f"a flipped byte at {at} went unnoticed"
    plain = bytearray(encode_record(Message("FooBar", BODY, tags="TAG1"), 0, 0, 1, HOST))
    plain[-3] ^= 0x20  # inside the TAGS value: outside the body CRC
    assert check_record(plain, 0, len(plain), True, 0)[0] == OK
