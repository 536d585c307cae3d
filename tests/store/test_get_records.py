"""Reads by records (MessageStore.get_records): the records get_messages answers, as their stored
bytes back to back, with the same offsets, limits, filters and errors. Every test runs with the
pure-Python gather and with the one in use (the compiled one where it is built)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.record_blocks import BORN_HOST, sent_block
from tests.store.conftest import StoreFactory
from tidemq.storage import Message, MessageStore, RecordsResult, SentBlock
from tidemq.storage import reads as reads_module
from tidemq.storage.errors import (
    CorruptRecordError,
    OffsetBelowMinError,
    OffsetBeyondMaxError,
    StoreError,
)
from tidemq.storage.javahash import tag_code
from tidemq.storage.record import block, gather

pytestmark = pytest.mark.store


@pytest.fixture(
    params=[
        pytest.param(gather.py_gather_records, id="twin"),
        pytest.param(block.gather_records, id=f"in_use_{block.IMPLEMENTATION}"),
    ]
)
def store(
    request: pytest.FixtureRequest, open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> MessageStore:
    monkeypatch.setattr(reads_module, "gather_records", request.param)
    return open_store()  # 4 KiB CommitLog files: a few records each, blank markers between


def same_answer(s: MessageStore, *args: Any, **kwargs: Any) -> RecordsResult | None:
    """get_records answers get_messages' records as their stored bytes, or raises what it
    raises; returns the answer (None after an error)."""
    refused: StoreError | None = None
    try:
        got = s.get_messages(*args, **kwargs)
    except StoreError as e:
        refused = e
    if refused is not None:
        with pytest.raises(type(refused)) as raised:
            s.get_records(*args, **kwargs)
        assert str(raised.value) == str(refused)
        return None
    records = s.get_records(*args, **kwargs)
    assert records.records == b"".join(s.read_raw(m.phy_offset, m.size) for m in got.messages)
    assert (records.count, records.next_offset, records.min_offset, records.max_offset) == (
        len(got.messages),
        got.next_offset,
        got.min_offset,
        got.max_offset,
    )
    return records


def put(s: MessageStore, msgs: Sequence[Message], *, blocks: bool = False) -> None:
    if blocks:
        sent = SentBlock(msgs[0].topic, msgs[0].queue_id, sent_block(msgs), len(msgs), BORN_HOST)
        s.put_blocks([sent]).dispatched.result(10)
    else:
        s.put_messages(msgs).dispatched.result(10)


def orders(queue_id: int, n: int, first: int = 0) -> list[Message]:
    return [
        Message("orders", f"order {i} ".encode() * (1 + i % 13), queue_id,
                tags=("even", "odd")[i % 2], keys=(f"k{i}",))
        for i in range(first, first + n)
    ]  # fmt: skip


def test_records_across_commitlog_files_are_the_bytes_get_messages_reads(
    store: MessageStore,
) -> None:
    s = store
    for part in range(6):  # message puts and block puts into two queues, many files in all
        put(s, orders(part % 2, 15, first=part * 15), blocks=part % 3 == 1)
    assert len(s.commitlog.mfq.files) >= 5
    for queue_id in (0, 1):
        hi = s.max_offset("orders", queue_id)
        for offset in range(hi + 1):
            for max_count, max_bytes in ((32, 256 * 1024), (3, 1 << 20), (64, 700), (1, 1)):
                for tags in (None, ["*"], ["odd"], ["even", "odd"], ["none"]):
                    same_answer(s, "orders", queue_id, offset, max_count, max_bytes, tags)
    got = same_answer(s, "orders", 0, 0, 64)
    assert got is not None and (got.count, got.next_offset) == (45, 45)


def test_a_record_larger_than_max_bytes_comes_alone_and_never_after_another(
    store: MessageStore,
) -> None:
    s = store
    put(s, [Message("big", b"s" * 10, 0), Message("big", b"L" * 2_000, 0)])
    got = same_answer(s, "big", 0, 1, 32, 100)
    assert got is not None and (got.count, got.next_offset) == (1, 2)
    got = same_answer(s, "big", 0, 0, 32, 100)
    assert got is not None and (got.count, got.next_offset) == (1, 1)  # the small one only


def test_range_errors_and_an_unknown_queue_are_answered_as_get_messages_answers(
    store: MessageStore,
) -> None:
    s = store
    put(s, orders(0, 10))
    with pytest.raises(OffsetBeyondMaxError):
        s.get_records("orders", 0, 11)
    assert same_answer(s, "orders", 0, 10) is not None  # at the end: nothing, not an error
    assert same_answer(s, "nothing", 3, 0) == RecordsResult(b"", 0, 0, 0, 0)
    assert same_answer(s, "nothing", 3, 1) is None
    cq = s.queues.get("orders", 0)
    assert cq is not None
    cq.min_logic_byte = 4 * 20  # as retention leaves a queue whose head file went
    with pytest.raises(OffsetBelowMinError):
        s.get_records("orders", 0, 3)
    assert same_answer(s, "orders", 0, 3) is None
    got = same_answer(s, "orders", 0, 4)
    assert got is not None and got.min_offset == 4


def test_a_tag_filter_keeps_only_the_exact_tag_where_tag_codes_collide(
    store: MessageStore,
) -> None:
    s = store
    assert tag_code("Aa") == tag_code("BB")  # Java's String.hashCode collides on these
    put(s, [Message("tags", f"{i}".encode(), 0, tags=("Aa", "BB", "C")[i % 3]) for i in range(30)])
    got = same_answer(s, "tags", 0, 0, 32, 1 << 20, ["Aa"])
    assert got is not None and got.count == 10 and got.next_offset == 30
    got = same_answer(s, "tags", 0, 0, 4, 1 << 20, ["BB"])
    assert got is not None and (got.count, got.next_offset) == (4, 11)


def test_a_selective_filter_stops_at_the_scan_budget(store: MessageStore) -> None:
    s = store
    for part in range(4):
        put(s, [Message("scan", b"x", 0, tags="common") for _ in range(100)], blocks=part % 2 == 0)
    put(s, [Message("scan", b"x", 0, tags="rare")])
    got = same_answer(s, "scan", 0, 0, 8, 1 << 20, ["rare"])
    assert got is not None and (got.count, got.next_offset) == (0, 256)  # max(8 * 16, 256)
    got = same_answer(s, "scan", 0, 256, 8, 1 << 20, ["rare"])
    assert got is not None and (got.count, got.next_offset) == (1, 401)


def test_the_confirm_offset_and_dispatch_bound_what_is_answered(store: MessageStore) -> None:
    s = store
    put(s, orders(0, 12))
    ends = [m.phy_offset + m.size for m in s.get_messages("orders", 0, 0, 64).messages]
    for cap in [0, ends[0] - 1, *ends, ends[5] + 3]:
        got = same_answer(s, "orders", 0, 0, 64, 1 << 20, None, max_commitlog_offset=cap)
        assert got is not None and got.count == sum(end <= cap for end in ends)
    with s.dispatch_held():
        s.put_messages(orders(0, 3, first=12)).wait()
        got = same_answer(s, "orders", 0, 10, 64)
        assert got is not None and (got.count, got.next_offset) == (2, 12)  # not dispatched yet
    s.dispatch_now()
    got = same_answer(s, "orders", 0, 10, 64)
    assert got is not None and (got.count, got.next_offset) == (5, 15)


def test_a_damaged_record_raises_what_get_messages_raises(store: MessageStore) -> None:
    s = store
    put(s, orders(0, 6))
    victim = s.get_messages("orders", 0, 3, 1).messages[0]
    f = s.commitlog.mfq.find_file(victim.phy_offset)
    assert f is not None
    f.mm[victim.phy_offset - f.base_offset + 90] ^= 0x01  # in its body
    assert same_answer(s, "orders", 0, 0, 2) is not None  # the records before it still read
    with pytest.raises(CorruptRecordError) as e:
        s.get_records("orders", 0, 0, 32)
    assert e.value.offset == victim.phy_offset
    assert same_answer(s, "orders", 0, 1, 32) is None


def test_records_in_a_deleted_commitlog_file_are_below_the_minimum(store: MessageStore) -> None:
    s = store
    put(s, orders(0, 30))
    first = s.commitlog.mfq.files[0]
    s.commitlog.mfq.delete_head(1)  # the first file, as retention deletes it
    assert first.closed
    with pytest.raises(OffsetBelowMinError) as e:
        s.get_records("orders", 0, 0, 32)
    assert e.value.offset == 0
    assert same_answer(s, "orders", 0, 0, 32) is None
