"""The block codec (storage.record.block): a sent block filled is exactly what the message path
stores, bad blocks are refused whole with a typed error naming the record, and a span scan
answers what dispatch needs. Each test runs the pure-Python twin and the implementation in use
(the compiled one where it is built); test_record_codec_twins.py holds the two to each other."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from tests.record_blocks import BORN_HOST, STORE_HOST, FilledSpans, fill, sent_block
from tidemq.storage.errors import (
    BodyTooLargeError,
    InvalidPropertyError,
    MessageIllegalError,
    PropertiesTooLargeError,
)
from tidemq.storage.record import Message, check_record, decode_record, encode_record
from tidemq.storage.record import block as codec
from tidemq.storage.record.block import CorruptBlockError, FilledBlock, SpanScan
from tidemq.storage.record.layout import HEADER_V4, TRANSACTION_PREPARED

Fill = Callable[..., tuple[FilledBlock, FilledSpans]]
Scan = Callable[..., SpanScan]
IMPLEMENTATIONS = [
    pytest.param((codec.py_fill_block, codec.py_scan_span), id="twin"),
    pytest.param((codec.fill_block, codec.scan_span), id=f"in_use_{codec.IMPLEMENTATION}"),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> tuple[Callable[..., FilledBlock], Scan]:
    fill_block, scan_span = request.param
    return fill_block, scan_span


@pytest.fixture
def fill_block(impl: tuple[Callable[..., FilledBlock], Scan]) -> Fill:
    def run(*args: Any) -> tuple[FilledBlock, FilledSpans]:
        return fill(*args, fill_block=impl[0])

    return run


@pytest.fixture
def scan_span(impl: tuple[Callable[..., FilledBlock], Scan]) -> Scan:
    return impl[1]


V6_HOST = (bytes(range(16)), 7000)


def messages(n: int = 3, queue_id: int = 2) -> list[Message]:
    out = [
        Message("Orders", b"body-%d" % i * 20, queue_id, born_timestamp_ms=1_000 + i,
                born_host=BORN_HOST)
        for i in range(n)
    ]  # fmt: skip
    out[0].tags = "paid"
    out[0].keys = ("order-1", "customer-9")
    out[-1].properties = {"trace": "t-1", "MESSAGE_GROUP": "g"}
    return out


def stored_by_message_path(
    msgs: list[Message], start: int, first_qoff: int, record_crc: bool,
    store_host: tuple[bytes, int] = STORE_HOST,
) -> bytes:  # fmt: skip
    out = []
    pos = start
    for i, m in enumerate(msgs):
        r = encode_record(m, first_qoff + i, pos, 99, store_host, record_crc=record_crc)
        out.append(r)
        pos += len(r)
    return b"".join(out)


@pytest.mark.parametrize("record_crc", [True, False])
def test_a_filled_block_is_byte_for_byte_what_the_message_path_stores(
    fill_block: Fill, record_crc: bool
) -> None:
    msgs = messages()
    filled, spans = fill_block(
        sent_block(msgs), 3, "Orders", 2, 5_000, 1 << 20, 7, 99, BORN_HOST, STORE_HOST,
        4 << 20, record_crc,
    )  # fmt: skip
    expected = stored_by_message_path(msgs, 5_000, 7, record_crc)
    assert spans == [(5_000, expected, False)]
    assert filled.spans == [(5_000, 0, len(expected), False)]
    assert filled.end == 5_000 + len(expected)
    assert filled.added_bytes == (20 if record_crc else 0)
    assert (filled.first_phy_offset, filled.file_starts) == (5_000, [])


def test_ipv6_born_and_store_hosts_are_laid_out_as_the_message_path_lays_them(
    fill_block: Fill,
) -> None:
    msgs = messages(2)
    for m in msgs:
        m.born_host = V6_HOST
    filled, spans = fill_block(
        sent_block(messages(2)), 2, "Orders", 2, 0, 1 << 20, 0, 99, V6_HOST, V6_HOST, 4 << 20,
        True,
    )  # fmt: skip
    assert spans[0][1] == stored_by_message_path(msgs, 0, 0, True, V6_HOST)
    assert filled.added_bytes == 20 + 12 + 12


def test_a_record_that_does_not_fit_its_file_starts_the_next_one_after_a_blank_marker(
    fill_block: Fill,
) -> None:
    msgs = messages(3)
    sizes = [len(encode_record(m, 0, 0, 99, STORE_HOST, record_crc=True)) for m in msgs]
    file_size = 4_096
    start = file_size - sizes[0] - sizes[1] - 4  # record 1 does not fit with its blank marker
    filled, spans = fill_block(
        sent_block(msgs), 3, "Orders", 2, start, file_size, 0, 99, BORN_HOST, STORE_HOST,
        4 << 20, True,
    )  # fmt: skip
    assert filled.spans == [
        (start, 0, sizes[0], False),
        (start + sizes[0], sizes[0], 0, True),
        (file_size, sizes[0], sizes[1] + sizes[2], False),
    ]
    assert filled.file_starts == [(1, file_size)]
    assert (filled.last_phy_offset, filled.last_size) == (file_size + sizes[1], sizes[2])
    expected = stored_by_message_path(msgs[1:], file_size, 1, True)
    assert spans[2][1] == expected


def test_an_idempotent_run_has_its_stamp_on_the_head_and_the_member_flag_on_the_others(
    fill_block: Fill,
) -> None:
    msgs = messages(3)
    stamp = b"PRODUCER_SEQ\x011f.3.a.3\x02"
    filled, spans = fill_block(
        sent_block(msgs), 3, "Orders", 2, 0, 1 << 20, 0, 99, BORN_HOST, STORE_HOST, 4 << 20,
        True, stamp, 0x800,
    )  # fmt: skip
    data = spans[0][1]
    stored = []
    pos = 0
    while pos < len(data):
        status, info = check_record(data, pos, len(data), True, pos, True)
        assert status == 0, info
        stored.append(decode_record(data, pos))
        pos += stored[-1].size
    assert stored[0].properties["PRODUCER_SEQ"] == "1f.3.a.3"
    assert [s.sys_flag for s in stored] == [0, 0x800, 0x800]
    assert [s.body for s in stored] == [m.body for m in msgs]
    assert stored[0].tags == "paid" and stored[0].keys == ["order-1", "customer-9"]
    assert filled.head_added_bytes == len(stamp)
    assert stored[0].size == len(sent_block(msgs[:1])) + 20 + len(stamp)


def _corrupt(block: bytes, at: int, value: bytes) -> bytes:
    return block[:at] + value + block[at + len(value) :]


def _corruptions() -> list[tuple[str, bytes, int, type[MessageIllegalError], str]]:
    msgs = messages(3)
    good = sent_block(msgs)
    first = HEADER_V4.unpack_from(good, 0)[0]
    second_at = first
    props_at = len(good) - len(b"trace\x01t-1\x02MESSAGE_GROUP\x01g\x02")
    i32 = struct.Struct(">i").pack
    return [
        ("bad magic", _corrupt(good, second_at + 4, b"\xde\xad\xbe\xef"), 3, CorruptBlockError,
         "record 1"),
        ("size past the end", _corrupt(good, second_at, i32(len(good))), 3, CorruptBlockError,
         "record 1"),
        ("size below the minimum", _corrupt(good, 0, i32(40)), 3, CorruptBlockError, "record 0"),
        ("a queue offset filled", _corrupt(good, second_at + 20, b"\x01"), 3, CorruptBlockError,
         "record 1"),
        ("born host set", _corrupt(good, 48, b"\x0a"), 3, CorruptBlockError, "record 0"),
        ("other queue", _corrupt(good, second_at + 12, i32(3)), 3, CorruptBlockError,
         "record 1"),
        ("other topic", good.replace(b"\x06Orders", b"\x06Ordera", 1), 3, CorruptBlockError,
         "record 0"),
        ("reserved property", _corrupt(good, props_at, b"__CRC32H\x01t"), 3,
         InvalidPropertyError, "record 2"),
        ("property without a value separator", _corrupt(good, props_at + 5, b"\x02"), 3,
         InvalidPropertyError, "record 2"),
        ("invalid UTF-8", _corrupt(good, props_at + 6, b"\xff"), 3, InvalidPropertyError,
         "record 2"),
        ("fewer records than counted", good, 4, CorruptBlockError, "record 3"),
        ("more records than counted", good, 2, CorruptBlockError, "after its 2 records"),
        ("no records", b"", 0, CorruptBlockError, "at least one"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("block", "count", "error", "names"),
    [pytest.param(b, c, e, n, id=name) for name, b, c, e, n in _corruptions()],
)
def test_a_malformed_block_is_refused_with_a_typed_error_naming_the_record(
    fill_block: Fill, block: bytes, count: int, error: type[MessageIllegalError], names: str
) -> None:
    with pytest.raises(error, match=names):
        fill_block(
            block, count, "Orders", 2, 0, 1 << 20, 0, 99, BORN_HOST, STORE_HOST, 4 << 20, True
        )


def test_limits_refuse_a_large_body_and_large_properties(fill_block: Fill) -> None:
    msgs = messages(1)
    with pytest.raises(BodyTooLargeError, match="record 0"):
        fill_block(sent_block(msgs), 1, "Orders", 2, 0, 1 << 20, 0, 9, BORN_HOST, STORE_HOST,
                   10, True)  # fmt: skip
    # Allowed without the record CRC property, 5 bytes too many with it.
    msgs = [Message("Orders", b"x", 2, properties={"big": "x" * 32_750})]
    with pytest.raises(PropertiesTooLargeError, match="record 0"):
        fill_block(sent_block(msgs), 1, "Orders", 2, 0, 1 << 20, 0, 9, BORN_HOST, STORE_HOST,
                   4 << 20, True)  # fmt: skip
    with pytest.raises(BodyTooLargeError, match="cannot fit a CommitLog file"):
        fill_block(sent_block(messages(1)), 1, "Orders", 2, 0, 200, 0, 9, BORN_HOST,
                   STORE_HOST, 4 << 20, True)  # fmt: skip


def _log(records: list[bytes]) -> bytearray:
    buf = bytearray(1 << 16)
    pos = 0
    for r in records:
        buf[pos : pos + len(r)] = r
        pos += len(r)
    return buf


def test_a_span_scan_answers_runs_of_queue_entries_and_the_keyed_records(scan_span: Scan) -> None:
    a = Message("Orders", b"a" * 50, 1, tags="paid", keys=("k1", "k2"))
    b = Message("Orders", b"b" * 50, 2)
    half = Message("Orders", b"h" * 50, 1, sys_flag=TRANSACTION_PREPARED)
    recs = []
    pos = 0
    # queue 1 offsets 4, 5, then 9 (a jump: a new run); queue 2 offset 0; a prepared half.
    for m, qoff in ((a, 4), (b, 0), (a, 5), (half, 6), (a, 9)):
        r = encode_record(m, qoff, pos, 1234, STORE_HOST, record_crc=True)
        recs.append(r)
        pos += len(r)
    scan = scan_span(_log(recs), 0, pos, 0, 0, True, 0)
    assert (scan.scanned, scan.end, scan.status, scan.last_store_timestamp_ms) == (5, pos, 0, 1234)
    runs = {(t, q, first): len(entries) // 20 for t, q, first, entries in scan.runs}
    assert runs == {("Orders", 1, 4): 2, ("Orders", 1, 9): 1, ("Orders", 2, 0): 1}
    entry = next(e for t, q, f, e in scan.runs if (q, f) == (1, 4))[:20]
    assert struct.unpack(">qiq", entry) == (0, len(recs[0]), 3433164)  # Java "paid".hashCode()
    assert [(phy, keys) for _, phy, _, keys in scan.keyed] == [
        (0, [b"k1", b"k2"]),
        (len(recs[0]) + len(recs[1]), [b"k1", b"k2"]),
        (pos - len(recs[4]), [b"k1", b"k2"]),
    ]


def test_a_span_scan_stops_at_a_corrupt_record_and_at_max_records(scan_span: Scan) -> None:
    m = Message("Orders", b"x" * 50, 0)
    recs = [encode_record(m, q, q * 167, 1, STORE_HOST, record_crc=True) for q in range(3)]
    assert len(recs[0]) == 167
    buf = _log(recs)
    buf[167 + 100] ^= 0xFF  # in record 1's body
    scan = scan_span(buf, 0, 501, 0, 0, True, 0)
    assert (scan.scanned, scan.end, scan.status) == (1, 167, 3)
    assert scan.reason is not None and "CRC" in scan.reason
    unchecked = scan_span(buf, 0, 501, 0, 10_000, True, 2)  # CRCs checked from 10,000 on
    assert (unchecked.scanned, unchecked.end, unchecked.status) == (2, 334, 0)
