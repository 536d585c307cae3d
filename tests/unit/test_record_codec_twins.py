"""The record codec's two implementations are one codec: the pure-Python twins
(``block.py_fill_block``, ``block.py_scan_span``, ``gather.py_gather_records``) and the compiled
ones (``_cblock``) give the same bytes, the same answers and the same errors.

First both against golden bytes (fills with IPv4 and IPv6 hosts, a block crossing a file end,
a span scan's ConsumeQueue runs and keys, a pull's gathered records), then against each other
on random valid blocks, random corruptions of them, and random garbage and damaged spans for
the scan and the gather: the same answer or the same exception and message, ``out`` untouched
by a refused block, and no crash. ``_cblock`` is imported directly: a machine that should have
built it (every CI machine has gcc) fails here rather than quietly testing Python twice.
"""

from __future__ import annotations

import itertools
import mmap
import os
import random
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.record_blocks import sent_block
from tidemq.storage.consume_queue import BLANK_ENTRY
from tidemq.storage.errors import CorruptRecordError, MessageIllegalError
from tidemq.storage.javahash import tag_code
from tidemq.storage.record import Message, _cblock, block, encode_record, gather
from tidemq.storage.record.block import FilledBlock, filled_size_bound
from tidemq.storage.record.gather import GatherResult
from tidemq.storage.record.layout import BLANK, BLANK_MAGIC, HEADER_V4, MAGIC_V2

pytestmark = pytest.mark.unit

block.hand_over(_cblock)  # as block's import does, also when TIDEMQ_PURE_PYTHON=1 chose Python

Fill = Callable[..., FilledBlock]
Scan = Callable[..., block.SpanScan]
Gather = Callable[..., GatherResult]
TWINS: dict[str, tuple[Fill, Scan, Gather]] = {
    "python": (block.py_fill_block, block.py_scan_span, gather.py_gather_records),
    "c": (_cblock.fill_block, _cblock.scan_span, _cblock.gather_records),
}
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NOW = 1_700_000_000_123
BORN4 = (b"\x0a\x00\x00\x07", 40123)
STORE4 = (b"\x0a\x00\x00\x05", 10911)
BORN6 = (bytes(range(0x20, 0x30)), 40124)
STORE6 = (bytes(range(0x40, 0x50)), 10912)
STAMP = b"PRODUCER_SEQ\x01p.1\x02"


@pytest.fixture(params=sorted(TWINS))
def twin(request: pytest.FixtureRequest) -> tuple[Fill, Scan, Gather]:
    return TWINS[request.param]


def test_the_compiled_codec_runs_unless_pure_python_is_asked_for() -> None:
    expected = "python" if os.environ.get("TIDEMQ_PURE_PYTHON") == "1" else "c"
    assert expected == block.IMPLEMENTATION
    code = "from tidemq.storage.record import block; print(block.IMPLEMENTATION)"
    env = {**os.environ, "TIDEMQ_PURE_PYTHON": "1"}
    chosen = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert chosen.stdout.strip() == "python"


# ------------------------------------------------------------------------------ golden bytes


def ipv4_block() -> bytes:
    return sent_block([
        Message("Orders", b"hello", 3, tags="paid", keys=("o-1", "c-9"),
                born_timestamp_ms=1_700_000_000_000, flag=7),
        Message("Orders", b"second", 3, properties={"trace": "t-1"}),
    ])  # fmt: skip


def ipv6_block() -> bytes:
    return sent_block([
        Message("Orders", b"v6", 1, tags="\u6807\u7b7e", born_timestamp_ms=5),
        Message("Orders", b"v6b", 1, born_timestamp_ms=6),
    ])  # fmt: skip


def file_end_block() -> bytes:
    return sent_block([Message("Logs", b"x" * 40, 0, tags=f"t{i}") for i in range(3)])


def scan_log() -> tuple[bytes, int]:
    """Records of two topics and three queues: a jump in queue 1's offsets, a timer record, a
    prepared and a rolled-back half, keys and a UNIQ_KEY; then a blank marker. (log, its end)"""
    msgs = [
        (Message("Orders", b"a", 1, tags="paid", keys=("k1",)), 4),
        (Message("Orders", b"b", 2), 0),
        (Message("Orders", b"c", 1, tags="paid"), 5),
        (Message("%SYS%TIMER", b"d", 0, tags="x",
                 properties={"TIMER_DELIVER_MS": "1700000000999"}), 0),
        (Message("Orders", b"e", 1, keys=("k5",), sys_flag=0x4), 6),
        (Message("Orders", b"f", 1, keys=("k6",), sys_flag=0xC), 7),
        (Message("Orders", b"g", 1, properties={"UNIQ_KEY": "U7", "KEYS": "a  b"}), 9),
    ]  # fmt: skip
    log = bytearray()
    for m, qoff in msgs:
        log += encode_record(m, qoff, len(log), NOW, STORE4, record_crc=True)
    end = len(log)
    log += BLANK.pack(64, BLANK_MAGIC) + bytes(56)
    return bytes(log), end


# Computed by the twins, which test_record_block holds to the message path's encoder.
IPV4_FILLED = bytes.fromhex(
    "00000091daa320a73610a686000000030000000700000000000000290000000000000fa0000000000000"
    "018bcfe568000a00000700009cbb0000018bcfe5687b0a00000500002a9f000000000000000000000000"
    "0000000568656c6c6f064f7264657273002b544147530170616964024b455953016f2d3120632d39025f"
    "5f43524333324801303537383232363537370200000085daa320a7361f11690000000300000000000000"
    "000000002a00000000000010310000000000000000000000010a00000700009cbb0000018bcfe5687b0a"
    "00000500002a9f000000000000000000000000000000067365636f6e64064f7264657273001e74726163"
    "6501742d31025f5f435243333248013230333931363331393502"
)

IPV6_FILLED = bytes.fromhex(
    "000000acdaa320a777065916000000010000000000000000000000000000000000000000000000300000"
    "000000000005202122232425262728292a2b2c2d2e2f00009cbc0000018bcfe5687b4041424344454647"
    "48494a4b4c4d4e4f00002aa0000000000000000000000000000000027636064f72646572730031544147"
    "5301e6a087e7adbe0250524f44554345525f53455101702e31025f5f4352433332480131363837313332"
    "3833360200000090daa320a7059d5cf10000000100000000000000000000000100000000000000ac0000"
    "08300000000000000006202122232425262728292a2b2c2d2e2f00009cbc0000018bcfe5687b40414243"
    "4445464748494a4b4c4d4e4f00002aa000000000000000000000000000000003763662064f7264657273"
    "00145f5f435243333248013137363634343130353902"
)

FILE_END_FILLED = bytes.fromhex(
    "0000008fdaa320a7441a71f00000000000000000000000000000000000000000000002d4000000000000"
    "0000000000010a00000700009cbb0000018bcfe5687b0a00000500002a9f000000000000000000000000"
    "000000287878787878787878787878787878787878787878787878787878787878787878787878787878"
    "7878044c6f6773000854414753017430020000008fdaa320a7441a71f000000000000000000000000000"
    "00000100000000000003630000000000000000000000010a00000700009cbb0000018bcfe5687b0a0000"
    "0500002a9f00000000000000000000000000000028787878787878787878787878787878787878787878"
    "78787878787878787878787878787878787878044c6f6773000854414753017431020000008fdaa320a7"
    "441a71f00000000000000000000000000000000200000000000004000000000000000000000000010a00"
    "000700009cbb0000018bcfe5687b0a00000500002a9f0000000000000000000000000000002878787878"
    "787878787878787878787878787878787878787878787878787878787878787878787878044c6f677300"
    "085441475301743202"
)

RUN_ORDERS_1_4 = bytes.fromhex(
    "00000000000000000000008800000000003462cc00000000000000fe0000008000000000003462cc"
)

RUN_ORDERS_1_9 = bytes.fromhex("000000000000031a0000008c0000000000000000")

RUN_ORDERS_2_0 = bytes.fromhex("0000000000000088000000760000000000000000")

RUN_TIMER_0_0 = bytes.fromhex("000000000000017e000000a00000018bcfe56be7")

GATHERED = bytes.fromhex(
    "00000088daa320a768b7be43000000010000000000000000000000040000000000000000000000000000"
    "018bcfe5687b7f000001000000000000018bcfe5687b0a00000500002a9f000000000000000000000000"
    "0000000161064f72646572730026544147530170616964024b455953016b31025f5f4352433332480131"
    "3534353439363937340200000080daa320a706b9df6f0000000100000000000000000000000500000000"
    "000000fe000000000000018bcfe5687b7f000001000000000000018bcfe5687b0a00000500002a9f0000"
    "000000000000000000000000000163064f7264657273001e544147530170616964025f5f435243333248"
    "0130393232373438303938020000008cdaa320a701d41b76000000010000000000000000000000090000"
    "00000000031a000000000000018bcfe5687b7f000001000000000000018bcfe5687b0a00000500002a9f"
    "0000000000000000000000000000000167064f7264657273002a554e49515f4b4559015537024b455953"
    "0161202062025f5f435243333248013131363937333735343302"
)


def test_an_ipv4_block_with_the_record_crc_fills_to_its_golden_bytes(
    twin: tuple[Fill, Scan, Gather],
) -> None:
    out = bytearray(b"\xee" * 400)
    filled = twin[0](
        ipv4_block(), 2, "Orders", 3, 4_000, 1 << 20, 41, NOW, BORN4, STORE4, 4 << 20, True,
        out, 16,
    )  # fmt: skip
    assert filled == FilledBlock([(4_000, 16, 278, False)], 4_278, 4_000, 4_145, 133, 20, 0, [], 11)
    assert out[16:294] == IPV4_FILLED
    assert set(out[:16]) == set(out[294:]) == {0xEE}


def test_ipv6_hosts_a_stamp_and_the_member_flag_fill_to_their_golden_bytes(
    twin: tuple[Fill, Scan, Gather],
) -> None:
    out = bytearray(b"\xee" * 400)
    filled = twin[0](
        ipv6_block(), 2, "Orders", 1, 0, 1 << 20, 0, NOW, BORN6, STORE6, 4 << 20, True, out, 0,
        STAMP, 0x800,
    )  # fmt: skip
    assert filled == FilledBlock([(0, 0, 316, False)], 316, 0, 172, 144, 44, len(STAMP), [], 5)
    assert out[:316] == IPV6_FILLED
    assert set(out[316:]) == {0xEE}


def test_a_block_crossing_a_file_end_fills_its_golden_bytes_around_a_blank_marker(
    twin: tuple[Fill, Scan, Gather],
) -> None:
    out = bytearray(600)
    filled = twin[0](
        file_end_block(), 3, "Logs", 0, 724, 1024, 0, NOW, BORN4, STORE4, 4 << 20, False, out,
        0,
    )  # fmt: skip
    # Records 0 and 1 end the first file at 1010: record 2 and a blank marker would not fit.
    assert filled.spans == [(724, 0, 286, False), (1010, 286, 0, True), (1024, 286, 143, False)]
    assert (filled.end, filled.first_phy_offset, filled.file_starts) == (1167, 724, [(2, 1024)])
    assert (filled.last_phy_offset, filled.last_size) == (1024, 143)
    assert out[:429] == FILE_END_FILLED


def test_a_span_scan_answers_its_golden_queue_runs_and_keys(
    twin: tuple[Fill, Scan, Gather],
) -> None:
    log, end = scan_log()
    scan = twin[1](log, 0, len(log), 0, 0, True, 0)
    assert (scan.scanned, scan.end, scan.status, scan.reason) == (7, end, 1, None)  # END_OF_FILE
    assert scan.last_store_timestamp_ms == NOW
    # Queue 1's run closes at the jump to 9 (listed first); the open runs follow in the order
    # their queues first appeared. The timer record's tag code is its delivery time.
    assert scan.runs == [
        ("Orders", 1, 4, RUN_ORDERS_1_4),
        ("Orders", 1, 9, RUN_ORDERS_1_9),
        ("Orders", 2, 0, RUN_ORDERS_2_0),
        ("%SYS%TIMER", 0, 0, RUN_TIMER_0_0),
    ]
    assert scan.keyed == [
        ("Orders", 0, NOW, [b"k1"]),
        ("Orders", 542, NOW, [b"k5"]),  # a prepared half is indexed, a rolled-back one not
        ("Orders", 794, NOW, [b"U7", b"a", b"", b"b"]),
    ]


def test_a_gather_appends_its_golden_records_and_stops_where_get_messages_would(
    twin: tuple[Fill, Scan, Gather],
) -> None:
    log, end = scan_log()
    entries = RUN_ORDERS_1_4 + BLANK_ENTRY + RUN_ORDERS_1_9
    gather_records = twin[2]

    def run(
        *,
        codes: set[int] | None = None,
        tags: list[str] | None = None,
        max_records: int = 32,
        max_bytes: int = 1 << 20,
        visible: int = end,
    ) -> tuple[GatherResult, bytes]:
        out = bytearray()
        got = gather_records(
            log, 0, len(log), end, visible, entries, codes, tags, max_records, max_bytes, out,
            True,
        )  # fmt: skip
        return got, bytes(out)

    assert run() == (GatherResult(4, 3, 404, gather.ENTRIES_END), GATHERED)
    first_two = log[:136] + log[254:382]
    # A tag no stored TAGS can decode to (a lone surrogate) matches nothing and breaks nothing.
    assert run(codes={tag_code("paid")}, tags=["paid", "\ud800"]) == (
        GatherResult(4, 2, 264, gather.ENTRIES_END),
        first_two,
    )
    assert run(max_bytes=200) == (GatherResult(1, 1, 136, gather.BYTE_LIMIT), log[:136])
    assert run(visible=800) == (GatherResult(3, 2, 264, gather.NOT_VISIBLE), first_two)
    assert run(max_records=2) == (GatherResult(2, 2, 264, gather.RECORD_LIMIT), first_two)
    # The first record comes whatever its size; the second only within max_bytes.
    assert run(max_bytes=1) == (GatherResult(1, 1, 136, gather.BYTE_LIMIT), log[:136])


# ------------------------------------------------------------------------------ crc32


def test_crc32_is_zlibs_on_every_length_to_4096_at_random_alignments() -> None:
    # Each path the CPU offers (tables; folds of 4 x 128 bits, of 4 x 512 bits) on its own.
    rng = random.Random(22)
    data = rng.randbytes(4096 + 64)
    for n in range(4097):
        at = rng.randrange(64)
        start = rng.getrandbits(32)
        piece = memoryview(data)[at : at + n]
        want = zlib.crc32(piece, start)
        assert _cblock.crc32(piece, start) == want, n
        assert set(_cblock._crc32_each(piece, start)) == {want}, n
    assert _cblock.crc32(b"123456789") == 0xCBF43926
    big = rng.randbytes((1 << 20) + 13)
    assert set(_cblock._crc32_each(big, 5)) == {zlib.crc32(big, 5)}


@SETTINGS
@given(st.binary(max_size=20_000), st.integers(-(1 << 70), 1 << 70))
def test_crc32_is_zlibs_for_any_bytes_and_start_value(data: bytes, start: int) -> None:
    assert _cblock.crc32(data, start) == zlib.crc32(data, start)
    assert _cblock.crc32(data) == zlib.crc32(data)


def test_crc32_of_a_large_buffer_released_the_gil_and_is_zlibs() -> None:
    data = os.urandom(3 << 20)
    assert _cblock.crc32(data, 7) == zlib.crc32(data, 7)


# ------------------------------------------------------------------------------ random blocks

_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=8)
_KEY = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02 "), min_size=1,
               max_size=6)  # fmt: skip
_NAME = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1,
                max_size=6).filter(lambda n: n not in block.RESERVED_NAMES)  # fmt: skip
_HOST = st.tuples(st.binary(min_size=4, max_size=4) | st.binary(min_size=16, max_size=16),
                  st.integers(0, 65_535))  # fmt: skip
_TOPICS = ("Orders", "%SYS%TIMER", "a", "T-1_x|%")


@st.composite
def _message(draw: st.DrawFn, topic: str, queue_id: int) -> Message:
    props = draw(st.dictionaries(_NAME, _TEXT, max_size=3))
    if draw(st.booleans()):
        props["UNIQ_KEY"] = draw(_KEY)
    if topic == "%SYS%TIMER":
        props["TIMER_DELIVER_MS"] = draw(
            st.sampled_from(["1700000000999", "x1", "", "9" * 19, "9223372036854775807"])
        )
    return Message(
        topic,
        draw(st.binary(max_size=200)),
        queue_id,
        tags=draw(st.none() | _TEXT),
        keys=tuple(draw(st.lists(_KEY, max_size=3))),
        properties=props,
        flag=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
        born_timestamp_ms=draw(st.sampled_from([0, 1]) | st.integers(0, (1 << 63) - 1)),
        sys_flag=draw(st.sampled_from([0, 0, 0x4, 0x8, 0xC])),
    )


@st.composite
def block_cases(draw: st.DrawFn) -> dict[str, Any]:
    """fill_block's arguments for a valid block (a large body or a small file still refuses)."""
    topic = draw(st.sampled_from(_TOPICS))
    queue_id = draw(st.integers(0, (1 << 31) - 1))
    msgs = draw(st.lists(_message(topic, queue_id), min_size=1, max_size=6))
    for m in msgs:
        m.sys_flag = 0  # a producer's block carries none; the broker fills SYSFLAG
    file_size = draw(st.integers(200, 4_096))
    return {
        "records": sent_block(msgs),
        "count": len(msgs),
        "topic": topic,
        "queue_id": queue_id,
        "start": draw(st.integers(0, 3 * file_size)),
        "file_size": file_size,
        "first_queue_offset": draw(st.integers(0, 1 << 40)),
        "now_ms": draw(st.integers(0, 1 << 45)),
        "born_host": draw(_HOST),
        "store_host": draw(_HOST),
        "max_body_bytes": draw(st.sampled_from([4 << 20, 4 << 20, 100])),
        "record_crc": draw(st.booleans()),
        "head_property": draw(st.sampled_from([b"", STAMP])),
        "member_sys_flag": draw(st.sampled_from([0, 0x800])),
    }


def _fill_outcome(fill_block: Fill, case: dict[str, Any], out_pos: int) -> tuple[Any, ...]:
    """What a fill answers, raises and leaves in ``out`` (which starts as a known pattern)."""
    args = dict(case)
    bound = filled_size_bound(
        len(args["records"]), args["count"], len(args["born_host"][0]) == 16,
        len(args["store_host"][0]) == 16, args["record_crc"], len(args["head_property"]),
    )  # fmt: skip
    out = bytearray(b"\xa5" * (out_pos + bound + 3))
    head, member = args.pop("head_property"), args.pop("member_sys_flag")
    try:
        filled = fill_block(*args.values(), out, out_pos, head, member)
    except (MessageIllegalError, ValueError) as e:
        assert out == bytearray(b"\xa5" * len(out)), "a refused block wrote to out"
        return ("refused", type(e), str(e))
    return ("filled", filled, bytes(out))


@SETTINGS
@given(block_cases(), st.integers(0, 40))
def test_random_valid_blocks_fill_the_same_bytes_in_both_twins(
    case: dict[str, Any], out_pos: int
) -> None:
    py = _fill_outcome(block.py_fill_block, case, out_pos)
    assert py == _fill_outcome(_cblock.fill_block, case, out_pos)


def _record_starts(records: bytes) -> list[int]:
    starts, at = [], 0
    while at + 4 <= len(records):
        starts.append(at)
        at += max(struct.unpack_from(">i", records, at)[0], 1)
    return starts


@st.composite
def corrupted_block_cases(draw: st.DrawFn) -> dict[str, Any]:
    case = draw(block_cases())
    data = bytearray(case["records"])
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "count", "filled", "overwrite"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            bit = draw(st.integers(0, len(data) * 8 - 1))
            data[bit // 8] ^= 1 << bit % 8
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=120))
    elif kind == "count":
        case["count"] += draw(st.sampled_from([-3, -1, 1, 2, 1 << 40]))
    elif kind == "filled":  # a field only the broker may fill, set by the producer
        at = draw(st.sampled_from(_record_starts(bytes(data))))
        field = draw(st.sampled_from([*range(8, 12), *range(20, 40), *range(48, 84)]))
        data[at + field] = draw(st.integers(1, 255))
    else:
        at = draw(st.integers(0, len(data) - 1))
        data[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
    case["records"] = bytes(data)
    return case


@SETTINGS
@given(corrupted_block_cases(), st.integers(0, 40))
def test_corrupted_blocks_are_refused_alike_and_leave_out_unwritten(
    case: dict[str, Any], out_pos: int
) -> None:
    py = _fill_outcome(block.py_fill_block, case, out_pos)
    assert py == _fill_outcome(_cblock.fill_block, case, out_pos)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"count": 0}, "at least one record"),
        ({"count": 1 << 60}, "record 2 of the block: 0 bytes left"),
        ({"file_size": 0}, "out of range"),
        ({"start": -1}, "out of range"),
        ({"out_pos": -5}, "out of range"),
        ({"out_pos": 1 << 40}, "out holds"),
        ({"out": bytearray(10)}, "out holds 10 bytes; the block needs 278 from out_pos 0"),
        ({"out": b"read-only"}, "out must be a writable buffer"),
        ({"born_host": (b"\x01\x02\x03", 1)}, "born host"),
        ({"store_host": (b"\x01\x02\x03\x04", 70_000)}, "store host"),
        ({"member_sys_flag": -1}, "member_sys_flag"),
    ],
)
def test_bad_arguments_are_refused_alike_before_anything_is_written(
    change: dict[str, Any], error: str
) -> None:
    outcomes = []
    for fill_block in (block.py_fill_block, _cblock.fill_block):
        args: dict[str, Any] = {
            "records": ipv4_block(), "count": 2, "topic": "Orders", "queue_id": 3,
            "start": 0, "file_size": 1 << 20, "first_queue_offset": 0, "now_ms": NOW,
            "born_host": BORN4, "store_host": STORE4, "max_body_bytes": 4 << 20,
            "record_crc": True, "out": bytearray(300), "out_pos": 0, "head_property": b"",
            "member_sys_flag": 0,
        }  # fmt: skip
        args.update({k: bytearray(v) if isinstance(v, bytearray) else v for k, v in change.items()})
        with pytest.raises((MessageIllegalError, ValueError, TypeError), match=error) as e:
            fill_block(**args)
        if isinstance(args["out"], bytearray):
            assert not any(args["out"])
            args["out"].append(1)  # no buffer export was left behind
        outcomes.append((e.type, str(e.value)))
    assert outcomes[0] == outcomes[1]


# ------------------------------------------------------------------------------ stored spans


def _v2_form(record: bytes) -> bytes:
    """A stored V1 record (IPv4 hosts, no record CRC) in RocketMQ's V2 layout: a 2-byte topic
    length. Its PHYSICALOFFSET is the caller's to set."""
    body_len = HEADER_V4.unpack_from(record, 0)[16]
    at = HEADER_V4.size + body_len
    out = bytearray(record[:at] + b"\x00" + record[at:])
    struct.pack_into(">iI", out, 0, len(out), MAGIC_V2)
    return bytes(out)


@st.composite
def stored_logs(draw: st.DrawFn) -> tuple[bytes, int, list[tuple[int, int, int]]]:
    """A CommitLog file's bytes (V1 with and without the record CRC, V2, IPv4 and IPv6 hosts,
    timer records, transaction halves), its base offset, and a ConsumeQueue entry (phy offset,
    size, tag code) per record."""
    base = draw(st.sampled_from([0, 4_096, 1 << 30]))
    log = bytearray()
    entries = []
    for _ in range(draw(st.integers(0, 7))):
        topic = draw(st.sampled_from(_TOPICS))
        m = draw(_message(topic, draw(st.integers(0, 3))))
        kind = draw(st.sampled_from(["crc", "plain", "v2", "v6"]))
        if kind == "v6":
            m.born_host = (bytes(16), 9)
        at = base + len(log)
        host = STORE6 if kind == "v6" else STORE4
        qoff = draw(st.integers(0, 9))
        rec = encode_record(m, qoff, at, NOW + len(log), host, record_crc=kind == "crc")
        if kind == "v2":
            v2 = bytearray(_v2_form(rec))
            struct.pack_into(">q", v2, 28, at)
            rec = bytes(v2)
        log += rec
        code = tag_code(m.tags) if m.tags else 0
        entries.append((at, len(rec), code))
    tail = draw(st.sampled_from(["none", "blank", "zeros", "garbage"]))
    if tail == "blank":
        log += BLANK.pack(40, BLANK_MAGIC) + bytes(32)
    elif tail == "zeros":
        log += bytes(draw(st.integers(1, 120)))
    elif tail == "garbage":
        log += draw(st.binary(max_size=120))
    return bytes(log), base, entries


def _damage(draw: Callable[[st.SearchStrategy[Any]], Any], log: bytes) -> bytes:
    data = bytearray(log)
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "bytes", "v2", "int"]))
        if how == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "bytes":
            data[at : at + 4] = draw(st.binary(min_size=1, max_size=4))
        elif how == "v2":  # V2 magic, whose topic length may then be anything
            data[at : at + 4] = struct.pack(">I", MAGIC_V2)
        else:
            data[at : at + 2] = struct.pack(">h", draw(st.integers(-(1 << 15), (1 << 15) - 1)))
    return bytes(data)


def _scan_outcome(scan_span: Scan, *args: Any) -> Any:
    try:
        return scan_span(*args)
    except ValueError as e:
        return (type(e), str(e))


@SETTINGS
@given(stored_logs(), st.data())
def test_span_scans_of_valid_damaged_and_garbage_spans_agree(
    logged: tuple[bytes, int, list[tuple[int, int, int]]], data: st.DataObject
) -> None:
    log, base, _ = logged
    log = data.draw(st.sampled_from([log, _damage(data.draw, log)]))
    if data.draw(st.booleans()):
        log = data.draw(st.binary(max_size=400)) + log  # garbage first, then records
    pos = data.draw(st.integers(0, max(0, len(log) - 1)) | st.just(0))
    limit = data.draw(st.integers(0, len(log)) | st.just(len(log)))
    verify_from = data.draw(st.sampled_from([0, base + len(log) // 2, 1 << 62]))
    require = data.draw(st.booleans())
    max_records = data.draw(st.sampled_from([0, 0, 1, 3]))
    # A buffer with no slack after the span: a field read past it must not crash either.
    buf = data.draw(st.sampled_from([log, log + bytes(200)]))
    args = (buf, pos, limit, base, verify_from, require, max_records)
    assert _scan_outcome(block.py_scan_span, *args) == _scan_outcome(_cblock.scan_span, *args)


@SETTINGS
@given(st.binary(max_size=300), st.integers(-3, 320), st.integers(-2, 400))
def test_span_scans_of_any_bytes_agree(raw: bytes, pos: int, limit: int) -> None:
    args = (raw, pos, limit, 0, 0, False, 0)
    assert _scan_outcome(block.py_scan_span, *args) == _scan_outcome(_cblock.scan_span, *args)


def _gather_outcome(gather_records: Gather, out_prefix: bytes, *args: Any) -> Any:
    out = bytearray(out_prefix)
    try:
        got = gather_records(*args[:10], out, *args[10:])
    except CorruptRecordError as e:
        return ("corrupt", e.offset, e.reason)
    except (ValueError, TypeError) as e:
        return (type(e), str(e))
    return (got, bytes(out))


@SETTINGS
@given(stored_logs(), st.data())
def test_gathers_of_valid_and_damaged_spans_agree(
    logged: tuple[bytes, int, list[tuple[int, int, int]]], data: st.DataObject
) -> None:
    log, base, records = logged
    log = data.draw(st.sampled_from([log, _damage(data.draw, log)]))
    entries = list(records)
    near = [(phy, size + d, code) for phy, size, code in records for d in (-1, 1)]
    for _ in range(data.draw(st.integers(0, 3))):  # blank, out-of-file and wrong entries
        wrong = data.draw(
            st.sampled_from([(0, 0x7FFFFFFF, 0), (base - 100, 50, 0), (base + len(log), 91, 0),
                             *near, (base + len(log) - 8, 8, 0)])
            | st.tuples(
                st.integers(base - 10, base + len(log) + 10), st.integers(-5, 300),
                st.integers(-(1 << 63), (1 << 63) - 1),
            )
        )  # fmt: skip
        entries.insert(data.draw(st.integers(0, len(entries))), wrong)
    packed = b"".join(struct.pack(">qiq", *e) for e in entries)
    end = base + len(log)
    readable = data.draw(st.integers(base, end + 5) | st.just(end))
    visible = data.draw(st.integers(base, end + 5) | st.just(readable))
    tags = data.draw(st.none() | st.lists(_TEXT, max_size=3))
    codes = None if tags is None else {tag_code(t) for t in tags}
    if tags is not None and data.draw(st.booleans()):
        codes = {c for _, _, c in records}  # every code: only the exact tags filter
    written = data.draw(st.integers(0, len(log)) | st.just(len(log)))
    args = (
        log, base, written, readable, visible, packed, codes, tags,
        data.draw(st.integers(0, 5) | st.just(32)),
        data.draw(st.integers(0, 600) | st.just(1 << 20)), data.draw(st.booleans()),
    )  # fmt: skip
    prefix = data.draw(st.sampled_from([b"", b"\x01" * 10]))
    py = _gather_outcome(gather.py_gather_records, prefix, *args)
    assert py == _gather_outcome(_cblock.gather_records, prefix, *args)


def test_gather_refuses_bad_arguments_alike() -> None:
    log, end = scan_log()
    cases: list[tuple[tuple[Any, ...], Any]] = [
        ((log, 0, len(log) + 1, end, end, b"", None, None, 1, 1), bytearray()),
        ((log, -1, len(log), end, end, b"", None, None, 1, 1), bytearray()),
        ((log, 0, len(log), end, end, b"\x00" * 21, None, None, 1, 1), bytearray()),
        ((log, 0, len(log), end, end, b"", None, None, 1, 1), b"not a bytearray"),
    ]
    gathers: list[Gather] = [gather.py_gather_records, _cblock.gather_records]
    for args, out in cases:
        outcomes = []
        for gather_records in gathers:
            with pytest.raises((ValueError, TypeError)) as e:
                gather_records(*args, out, True)
            outcomes.append((e.type, str(e.value)))
        assert outcomes[0] == outcomes[1]


def test_no_buffer_export_outlives_a_call_even_one_that_failed() -> None:
    log, end = scan_log()
    mm = mmap.mmap(-1, 4_096)
    mm[: len(log)] = log
    mm[10] ^= 0xFF  # the first record is corrupt
    _cblock.scan_span(mm, 0, len(log), 0, 0, True, 0)
    with pytest.raises(CorruptRecordError):
        _cblock.gather_records(
            mm, 0, len(log), end, end, RUN_ORDERS_1_4, None, None, 9, 1 << 20, bytearray(), True
        )
    with pytest.raises(ValueError, match="outside a buffer"):
        _cblock.scan_span(mm, 0, 5_000, 0, 0, True, 0)
    mm.close()  # BufferError if a call had kept the mapping exported


def _raw_record(props: bytes, phy: int, topic: bytes = b"Orders", qoff: int = 0) -> bytes:
    """A stored record (V1, IPv4, no record CRC) with properties as given, valid or not."""
    body = b"body"
    size = HEADER_V4.size + len(body) + 1 + len(topic) + 2 + len(props)
    header = HEADER_V4.pack(
        size, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, 1, 0, qoff, phy, 0, 5,
        STORE4[0], 1, NOW, STORE4[0], STORE4[1], 0, 0, len(body),
    )  # fmt: skip
    return header + body + bytes((len(topic),)) + topic + struct.pack(">h", len(props)) + props


_VALUE = st.binary(max_size=12).map(lambda b: b.replace(b"\x01", b"").replace(b"\x02", b""))


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"TIMER_DELIVER_MS", b"x"]),
                  st.booleans(), _VALUE),
        max_size=4,
    ),
    st.sampled_from([b"Orders", b"%SYS%TIMER", b"Orders\n", b"\n", b"Or ders"]),
    st.lists(st.text(max_size=3) | st.just("\ufffd"), max_size=3),
)  # fmt: skip
def test_any_property_bytes_give_the_same_tag_codes_keys_and_tag_matches(
    items: list[tuple[bytes, bool, bytes]], topic: bytes, tags: list[str]
) -> None:
    # Invalid UTF-8 in TAGS decodes with replacement characters, as a reader decodes it; an
    # item without 0x01 is a name alone; "$" in the topic rule also matches before one newline.
    props = b"".join(
        name + (b"\x01" if sep else b"") + value + b"\x02" for name, sep, value in items
    )
    rec = _raw_record(props, 0, topic)
    log = rec + bytes(16)
    scans = [
        scan(log, 0, len(log), 0, 0, False, 0) for scan in (block.py_scan_span, _cblock.scan_span)
    ]
    assert scans[0] == scans[1]
    entry = scans[0].runs[0][3] if scans[0].runs else struct.pack(">qiq", 0, len(rec), 0)
    end = len(rec)
    outcomes = [
        _gather_outcome(g, b"", log, 0, len(log), end, end, entry, None, tags, 9, 1 << 20, False)
        for g in (gather.py_gather_records, _cblock.gather_records)
    ]
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("require_record_crc", [False, True])
def test_v2_records_with_any_topic_length_field_agree(require_record_crc: bool) -> None:
    # A V2 topic length is an int16; a negative one points the properties' length before the
    # topic, even before the buffer, where Python's indexing counts from the end.
    rec = _v2_form(_raw_record(b"TAGS\x01t\x02", 0))
    at = HEADER_V4.size + 4  # the topic length, after the 4-byte body
    for topic_len in [*range(-420, 40), -(1 << 15), (1 << 15) - 1]:
        log = bytearray(rec + bytes(8))
        struct.pack_into(">h", log, at, topic_len)
        for lead, matched in itertools.product((0, 300), (False, True)):
            buf = bytearray(lead) + log  # the record at 0, or at 300 of a longer buffer
            struct.pack_into(">q", buf, lead + 28, lead)
            if matched:  # the properties' length, read where Python reads it, fits the record
                props_len_at = lead + at + 2 + topic_len
                where = props_len_at if props_len_at >= 0 else len(buf) + props_len_at
                value = lead + len(rec) - props_len_at - 2
                if 0 <= where <= len(buf) - 2 and -(1 << 15) <= value < 1 << 15:
                    struct.pack_into(">h", buf, where, value)
            args = (bytes(buf), lead, len(buf), 0, 0, require_record_crc, 0)
            assert block.py_scan_span(*args) == _cblock.scan_span(*args), topic_len
            entry = struct.pack(">qiq", lead, len(rec), 0)
            outcomes = [
                _gather_outcome(g, b"", bytes(buf), 0, len(buf), len(buf), len(buf), entry, None,
                                None, 9, 1 << 20, require_record_crc)
                for g in (gather.py_gather_records, _cblock.gather_records)
            ]  # fmt: skip
            assert outcomes[0] == outcomes[1], topic_len


# ------------------------------------------------------------------------------ specific paths


def _legacy(m: Message, phy: int) -> bytes:
    """A record with RocketMQ's whole-record CRC (``__CRC32#``), as earlier builds wrote it."""
    rec = bytearray(encode_record(m, 0, phy, NOW, STORE4, record_crc=True))
    rec[-20:-11] = b"__CRC32#\x01"
    crc = zlib.crc32(rec[:-20]) & 0x7FFFFFFF
    rec[-11:-1] = str(crc)[::-1].ljust(10, "0").encode()
    return bytes(rec)


@pytest.mark.parametrize("kind", ["record_crc", "legacy_crc", "v2", "ipv6"])
def test_every_single_byte_damage_is_answered_alike(kind: str) -> None:
    m = Message("Orders", b"body bytes", 1, tags="paid", keys=("k",), born_host=BORN4)
    if kind == "legacy_crc":
        rec = _legacy(m, 0)
    elif kind == "v2":
        rec = _v2_form(encode_record(m, 0, 0, NOW, STORE4))
    else:
        m.born_host = BORN6 if kind == "ipv6" else BORN4
        rec = encode_record(m, 0, 0, NOW, STORE6 if kind == "ipv6" else STORE4, record_crc=True)
    entry = struct.pack(">qiq", 0, len(rec), tag_code("paid"))
    for at, bit in itertools.product(range(len(rec)), (0x01, 0x80)):
        log = bytearray(rec + bytes(12))
        log[at] ^= bit
        buf = bytes(log)
        for require in (False, True):
            args = (buf, 0, len(buf), 0, 0, require, 0)
            assert block.py_scan_span(*args) == _cblock.scan_span(*args), (at, bit)
            outcomes = [
                _gather_outcome(g, b"", buf, 0, len(buf), len(buf), len(buf), entry, None,
                                ["paid"], 9, 1 << 20, require)
                for g in (gather.py_gather_records, _cblock.gather_records)
            ]  # fmt: skip
            assert outcomes[0] == outcomes[1], (at, bit)


def _patched(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def _refusals() -> list[Any]:
    good = ipv4_block()
    second = struct.unpack_from(">i", good)[0]
    reserved = sent_block([Message("Orders", b"x", 3, properties={"PRODUCER_SEQ": "p"})])
    return [
        pytest.param(_patched(good, len(good) - 1, b"\x00"), id="properties_end"),
        pytest.param(reserved, id="reserved_name"),
        pytest.param(_patched(good, second + 40, b"\xff" * 8), id="negative_born_time"),
        pytest.param(_patched(good, 84, b"\x00\x00\x10\x00"), id="body_length"),
        pytest.param(_patched(good, 84, b"\xff\xff\xff\xff"), id="negative_body_length"),
        pytest.param(_patched(good, second - 25, b"\x00\x15"), id="properties_length"),
    ]


@pytest.mark.parametrize("records", _refusals())
def test_each_kind_of_bad_record_is_refused_alike(records: bytes) -> None:
    case = {
        "records": records, "count": 1 if len(records) < 150 else 2, "topic": "Orders",
        "queue_id": 3, "start": 0, "file_size": 1 << 20, "first_queue_offset": 0,
        "now_ms": NOW, "born_host": BORN4, "store_host": STORE4, "max_body_bytes": 4 << 20,
        "record_crc": True, "head_property": b"", "member_sys_flag": 0,
    }  # fmt: skip
    py = _fill_outcome(block.py_fill_block, case, 0)
    assert py[0] == "refused"
    assert py == _fill_outcome(_cblock.fill_block, case, 0)


def test_a_block_of_hundreds_of_records_fills_alike() -> None:
    msgs = [Message("Orders", b"m%d" % i, 0, tags=f"t{i % 7}") for i in range(300)]
    case = {
        "records": sent_block(msgs), "count": 300, "topic": "Orders", "queue_id": 0,
        "start": 10_000, "file_size": 8_192, "first_queue_offset": 5, "now_ms": NOW,
        "born_host": BORN4, "store_host": STORE6, "max_body_bytes": 4 << 20,
        "record_crc": True, "head_property": STAMP, "member_sys_flag": 0x800,
    }  # fmt: skip
    py = _fill_outcome(block.py_fill_block, case, 7)
    assert py[0] == "filled" and len(py[1].file_starts) == 5
    assert py == _fill_outcome(_cblock.fill_block, case, 7)


def test_a_block_read_from_the_buffer_it_fills_gives_the_same_bytes() -> None:
    records = ipv4_block()
    outs = []
    for fill_block in (block.py_fill_block, _cblock.fill_block):
        out = bytearray(records + bytes(100))  # the block sits where its records go
        filled = fill_block(
            memoryview(out)[: len(records)], 2, "Orders", 3, 4_000, 1 << 20, 41, NOW, BORN4,
            STORE4, 4 << 20, True, out, 0,
        )  # fmt: skip
        outs.append((filled, bytes(out)))
    assert outs[0] == outs[1]
    assert outs[0][1][:278] == IPV4_FILLED


def test_a_span_of_many_topics_and_queues_scans_alike() -> None:
    log = bytearray()
    for i in range(120):
        m = Message(f"topic-{i % 23}", b"x", i % 5, tags=f"t{i}", keys=(f"k{i}",))
        log += encode_record(m, i // 3 + (i % 4 == 0) * 7, len(log), NOW + i, STORE4)
    args = (bytes(log), 0, len(log), 0, 0, False, 0)
    scan = block.py_scan_span(*args)
    assert len(scan.runs) > 100 and scan.scanned == 120
    assert scan == _cblock.scan_span(*args)


def test_crc32_refuses_what_zlib_refuses() -> None:
    crc32s: list[Callable[..., int]] = [_cblock.crc32, zlib.crc32]
    for args in [(), (b"a", "x"), ("text",), (b"a", 1, 2)]:
        for crc32 in crc32s:
            with pytest.raises(TypeError):
                crc32(*args)


@pytest.mark.parametrize(
    ("entry", "readable", "reason"),
    [
        ((934, 8, 0), 998, "a blank marker, not a record"),  # where scan_log's blank marker is
        ((0, 135, 0), 934, "not a record"),  # the record is 136 bytes
        ((934, 0, 0), 934, "no record at this offset"),  # at the readable end
        ((0, 136, 0), 934, "body CRC mismatch"),  # the record, its body damaged below
    ],
)
def test_a_gather_raises_for_a_bad_entry_what_commitlog_read_raises(
    twin: tuple[Fill, Scan, Gather], entry: tuple[int, int, int], readable: int, reason: str
) -> None:
    log = bytearray(scan_log()[0])
    if "CRC" in reason:
        log[88] ^= 0x01  # the first record's body
    with pytest.raises(CorruptRecordError) as e:
        twin[2](
            bytes(log), 0, len(log), readable, 1 << 20, struct.pack(">qiq", *entry), None, None, 9,
            1 << 20, bytearray(), True,
        )  # fmt: skip
    assert (e.value.offset, e.value.reason) == (entry[0], reason)
