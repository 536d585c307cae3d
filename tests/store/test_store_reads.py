"""The read paths a broker serves: pulls with tag filters and limits, offsets, lookups."""

import time

import pytest

from tests.store.conftest import StoreFactory
from tidemq.storage import AppendResult, FlushMode, Message, MessageStore, PutStatus
from tidemq.storage.errors import (
    InvalidQueueIdError,
    InvalidTopicError,
    MessageNotFoundError,
    OffsetBeyondMaxError,
)
from tidemq.storage.record import OK

pytestmark = pytest.mark.store


def fill(store: MessageStore, n: int, queues: int = 2) -> list[AppendResult]:
    r = store.put_messages(
        [
            Message(
                "orders",
                f"body-{i}".encode(),
                queue_id=i % queues,
                tags="even" if i % 2 == 0 else "odd",
                keys=[f"order-{i}"],
            )
            for i in range(n)
        ]
    )
    assert r.wait() is PutStatus.PUT_OK
    assert store.wait_dispatched(store.commitlog.max_offset, 10)
    return r.results


def test_pull_in_order_with_limits(open_store: StoreFactory) -> None:
    s = open_store()
    results = fill(s, 60, queues=1)
    assert [r.queue_offset for r in results] == list(range(60))
    got = s.get_messages("orders", 0, 0, max_count=25)
    assert [m.queue_offset for m in got.messages] == list(range(25))
    assert got.next_offset == 25 and got.max_offset == 60 and got.min_offset == 0
    assert [m.body for m in got.messages[:2]] == [b"body-0", b"body-1"]
    # max_bytes: whole records only, at least one
    three = sum(m.size for m in s.get_messages("orders", 0, 10, max_count=3).messages)
    few = s.get_messages("orders", 0, 10, max_count=32, max_bytes=three)
    assert len(few.messages) == 3 and few.next_offset == 13
    one = s.get_messages("orders", 0, 10, max_count=32, max_bytes=1)
    assert len(one.messages) == 1
    head = s.get_messages("orders", 0, 60)
    assert head.messages == [] and head.next_offset == 60
    with pytest.raises(OffsetBeyondMaxError):
        s.get_messages("orders", 0, 61)


def test_tag_filter(open_store: StoreFactory) -> None:
    s = open_store()
    fill(s, 40, queues=1)
    odd = s.get_messages("orders", 0, 0, max_count=100, tags=["odd"])
    assert [m.queue_offset for m in odd.messages] == list(range(1, 40, 2))
    both = s.get_messages("orders", 0, 0, max_count=100, tags=["odd", "even"])
    assert len(both.messages) == 40
    star = s.get_messages("orders", 0, 0, max_count=100, tags=["*"])
    assert len(star.messages) == 40
    none = s.get_messages("orders", 0, 0, max_count=100, tags=["missing"])
    assert none.messages == [] and none.next_offset == 40


def test_lookup_by_offset_id_key_and_time(open_store: StoreFactory) -> None:
    s = open_store()
    t0 = int(time.time() * 1000) - 1
    results = fill(s, 30)
    r = results[17]
    m = s.look_message(r.phy_offset)
    assert m.body == b"body-17" and m.queue_offset == r.queue_offset
    assert s.get_message_by_id(r.msg_id).body == b"body-17"
    with pytest.raises(MessageNotFoundError):
        s.get_message_by_id("0A00000100002A9F" + "0" * 16)  # another host
    found = s.query_by_key("orders", "order-17")
    assert [x.body for x in found] == [b"body-17"]
    assert s.query_by_key("orders", "order-17", begin_ms=0, end_ms=t0 - 10_000) == []
    assert s.query_by_key("other", "order-17") == []
    assert s.offset_by_time("orders", 0, 0) == 0
    assert s.offset_by_time("orders", 0, 2**62) == s.max_offset("orders", 0)


def test_bad_input_is_refused_and_changes_nothing(open_store: StoreFactory) -> None:
    s = open_store()
    fill(s, 3)
    before = s.commitlog.max_offset
    with pytest.raises(InvalidTopicError):
        s.put_messages([Message("ok", b"1"), Message("bad topic", b"2")])
    with pytest.raises(InvalidQueueIdError):
        s.put_messages([Message("ok", b"1", queue_id=-1)])
    assert s.commitlog.max_offset == before
    assert s.max_offset("ok", 0) == 0


def test_batch_results_and_queue_offsets_per_queue(open_store: StoreFactory) -> None:
    s = open_store()
    r = s.put_messages([Message("a", b"x", queue_id=q) for q in (0, 1, 0, 2, 0)])
    assert [x.queue_offset for x in r.results] == [0, 0, 1, 0, 2]
    offsets = [x.phy_offset for x in r.results]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5


def test_what_code_outside_the_store_reads(open_store: StoreFactory) -> None:
    """The accessors replication, failover and the benchmark use tell what the parts hold."""
    s = open_store(flush_mode=FlushMode.SYNC)
    assert s.log.file_base_offsets() == [] and s.log.max_offset == 0
    results = fill(s, 40)
    log = s.log
    assert log.file_base_offsets() == [f.base_offset for f in s.commitlog.mfq.files]
    assert len(log.file_base_offsets()) > 1 and log.file_size == 4096
    assert (log.min_offset, log.max_offset) == (0, s.commitlog.max_offset)
    assert s.dispatched_offset == log.max_offset
    assert s.dispatched_store_timestamp_ms == results[-1].store_timestamp_ms
    assert s.commitlog_flushes >= 1
    first = log.read_raw(0, 4096)
    assert int.from_bytes(first[28:36], "big") == 0  # PHYSICALOFFSET of the first record
    walked = [at for at, status, _ in log.iter_records(0, log.max_offset, 0) if status == OK]
    assert walked == [r.phy_offset for r in results]
    with s.dispatch_held():
        assert s.put_messages([Message("orders", b"held")]).wait(30) is PutStatus.PUT_OK
        assert s.dispatched_offset < log.max_offset or s.dispatch_now() == 0
        s.dispatch_now()
        assert s.dispatched_offset == log.max_offset
