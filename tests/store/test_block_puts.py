"""Puts by the block (MessageStore.put_blocks): what a producer-encoded block stores, where the
placements say it went, and a bad block in a request storing nothing at all."""

from __future__ import annotations

import pytest

from tests.record_blocks import BORN_HOST, sent_block
from tests.store.conftest import StoreFactory
from tidemq.storage import BlockPlacement, CorruptBlockError, Message, MessageStore, SentBlock
from tidemq.storage.record.layout import RECORD_CRC_SIZE

pytestmark = pytest.mark.store


def queue_messages(queue_id: int, n: int, first: int = 0) -> list[Message]:
    return [
        Message("orders", f"order {i} ".encode() * 9, queue_id, tags=f"t{i % 2}",
                keys=(f"key-{i}",), born_timestamp_ms=5_000 + i)
        for i in range(first, first + n)
    ]  # fmt: skip


def block(msgs: list[Message]) -> SentBlock:
    return SentBlock("orders", msgs[0].queue_id, sent_block(msgs), len(msgs), BORN_HOST)


def offsets_of(placement: BlockPlacement, sent_sizes: list[int]) -> list[int]:
    """Each record's CommitLog offset, as a producer derives it from the placement."""
    starts = dict(placement.file_starts)
    out = []
    pos = placement.first_phy_offset
    for i, size in enumerate(sent_sizes):
        pos = starts.get(i, pos)
        out.append(pos)
        pos += size + placement.added_bytes + (placement.head_added_bytes if i == 0 else 0)
    return out


def test_blocks_are_stored_where_their_placements_say_readable_and_indexed(
    open_store: StoreFactory,
) -> None:
    s: MessageStore = open_store()  # 4 KiB CommitLog files: these blocks roll over several
    s.put_messages(queue_messages(0, 1)).wait()  # queue 0 already holds one message
    blocks = [queue_messages(0, 12, first=1), queue_messages(1, 9, first=100)]
    put = s.put_blocks([block(b) for b in blocks])
    assert put.durable.result(5) is not None
    put.dispatched.result(10)
    assert len(put.placements) == 2
    assert any(p.file_starts for p in put.placements), "the blocks should cross a file"
    for placement, msgs in zip(put.placements, blocks, strict=True):
        sizes = [len(sent_block([m])) for m in msgs]
        got = s.get_messages("orders", placement.queue_id, placement.first_queue_offset, 64)
        assert [m.body for m in got.messages] == [m.body for m in msgs]
        assert [m.phy_offset for m in got.messages] == offsets_of(placement, sizes)
        assert [m.queue_offset for m in got.messages] == list(
            range(placement.first_queue_offset, placement.first_queue_offset + len(msgs))
        )
        assert [m.size for m in got.messages] == [n + RECORD_CRC_SIZE for n in sizes]
        assert all(m.store_timestamp_ms == put.store_timestamp_ms for m in got.messages)
        assert [m.born_timestamp_ms for m in got.messages] == [m.born_timestamp_ms for m in msgs]
        assert [(m.tags, m.keys) for m in got.messages] == [(m.tags, list(m.keys)) for m in msgs]
    assert put.placements[0].first_queue_offset == 1
    found = s.query_by_key("orders", "key-5")
    assert [m.body for m in found] == [b"order 5 " * 9]


def test_a_request_with_one_bad_block_stores_nothing(open_store: StoreFactory) -> None:
    s = open_store()
    s.put_messages(queue_messages(0, 3)).dispatched.result(10)
    end = s.commitlog.max_offset
    bad = block(queue_messages(1, 3))
    bad = bad._replace(records=bad.records[:-1] + b"\x00")  # properties no longer end in 0x02
    with pytest.raises(Exception, match="record 2") as refused:
        s.put_blocks([block(queue_messages(0, 4)), bad])
    assert refused.type.__name__ == "InvalidPropertyError"
    with pytest.raises(CorruptBlockError):
        s.put_blocks([block(queue_messages(1, 3))._replace(record_count=4)])
    assert s.commitlog.max_offset == end
    assert (s.max_offset("orders", 0), s.max_offset("orders", 1)) == (3, 0)
    put = s.put_blocks([block(queue_messages(0, 2))])
    assert put.placements[0].first_queue_offset == 3
    assert put.placements[0].first_phy_offset == end


def test_message_and_block_puts_share_one_queue_order(open_store: StoreFactory) -> None:
    s = open_store()
    s.put_messages(queue_messages(0, 2)).wait()
    s.put_blocks([block(queue_messages(0, 3, first=2))])
    r = s.put_messages(queue_messages(0, 2, first=5))
    assert [x.queue_offset for x in r.results] == [5, 6]
    r.dispatched.result(10)
    got = s.get_messages("orders", 0, 0, 64).messages
    assert [m.body for m in got] == [f"order {i} ".encode() * 9 for i in range(7)]
