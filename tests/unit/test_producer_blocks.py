"""The producer's record blocks (tidemq.producer.blocks), without a broker: how messages join
blocks, when blocks are handed to the sender, and how a block's answer becomes each message's
result."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator

import pytest

from tidemq.errors import ClientClosedError, InvalidArgumentError
from tidemq.producer.blocks import Block, BlockAnswer, BlockCollector, BlockFuture
from tidemq.producer.config import ProducerConfig
from tidemq.producer.futures import Hub
from tidemq.protos.record_blocks import decode_records
from tidemq.routes import MessageQueue
from tidemq.types import ReceivedMessage, SendStatus


class Harness:
    """A collector on a loop of its own thread, recording the blocks it hands over."""

    def __init__(self, **settings: object) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.handed: list[Block] = []
        self.sending_now = False
        self.collector = BlockCollector(
            ProducerConfig(**settings),  # type: ignore[arg-type]
            Hub(),
            self.loop,
            self.handed.append,
            lambda: self.sending_now,
        )
        self.thread.start()

    def on_loop(self, fn: object) -> None:
        """Run ``fn`` on the loop and wait for it (and for everything queued before it)."""
        done = threading.Event()

        def run() -> None:
            fn()  # type: ignore[operator]
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(batch_max_messages=4, batch_max_bytes=1 << 20)
    yield h
    h.close()


def test_messages_of_a_topic_share_a_block_until_it_is_full_then_it_is_handed_over_at_once(
    harness: Harness,
) -> None:
    futures = [harness.collector.add("orders", f"m{i}", None, (), None) for i in range(6)]
    harness.on_loop(lambda: None)  # the wake-up the adds scheduled has run
    [full] = harness.handed  # the open block of two waits: no request could leave
    assert full.count == 4 and full.builder.sealed
    assert [f.owner for f in futures[:4]] == [full] * 4
    assert [f.index for f in futures] == [0, 1, 2, 3, 0, 1]
    harness.on_loop(harness.collector.take_open)  # a flush
    assert [b.count for b in harness.handed] == [4, 2]


def test_an_open_block_is_taken_as_soon_as_a_request_could_leave(harness: Harness) -> None:
    harness.sending_now = True
    harness.collector.add("orders", b"alone", None, (), None)
    harness.on_loop(lambda: None)
    assert [b.count for b in harness.handed] == [1]


def test_topics_get_blocks_of_their_own(harness: Harness) -> None:
    for topic in ("a", "b", "a"):
        harness.collector.add(topic, b"x", None, (), None)
    harness.on_loop(harness.collector.take_open)
    assert sorted((b.topic, b.count) for b in harness.handed) == [("a", 2), ("b", 1)]


def test_a_bad_message_is_refused_alone_and_its_block_keeps_the_others(harness: Harness) -> None:
    harness.collector.add("orders", b"fine", None, (), None)
    with pytest.raises(InvalidArgumentError, match="key"):
        harness.collector.add("orders", b"bad", None, ("has space",), None)
    with pytest.raises(InvalidArgumentError):
        harness.collector.add("bad topic!", b"x", None, (), None)
    harness.on_loop(harness.collector.take_open)
    [block] = harness.handed
    assert block.count == 1


def test_a_closed_collector_refuses_new_blocks(harness: Harness) -> None:
    harness.collector.close()
    with pytest.raises(ClientClosedError):
        harness.collector.add("orders", b"late", None, (), None)


def test_linger_hands_an_open_block_over_once_it_has_lingered() -> None:
    h = Harness(batch_max_messages=100, linger_ms=30)
    try:
        h.collector.add("orders", b"x", None, (), None)
        waited = threading.Event()
        h.loop.call_soon_threadsafe(lambda: h.loop.call_later(0.2, waited.set))
        assert waited.wait(10)
        h.on_loop(lambda: None)
        assert [b.count for b in h.handed] == [1]
    finally:
        h.close()


def test_threads_adding_while_blocks_are_taken_lose_no_message(harness: Harness) -> None:
    per_thread = 2_000
    futures: list[list[BlockFuture]] = [[] for _ in range(4)]

    def add(k: int) -> None:
        for i in range(per_thread):
            futures[k].append(harness.collector.add("t", f"{k}:{i}", None, (), None))

    threads = [threading.Thread(target=add, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        harness.on_loop(harness.collector.take_open)
    for t in threads:
        t.join(30)
    harness.on_loop(harness.collector.take_open)
    handed = {id(b): b for b in harness.handed}
    assert sum(b.count for b in handed.values()) == 4 * per_thread
    bodies: set[bytes] = set()
    for fs in futures:
        for f in fs:
            assert id(f.owner) in handed, "a message went into a block never handed over"
    for b in handed.values():
        b.queue = MessageQueue("t", "broker-a", 0)
        # A sent block decodes as stored records would (its broker's fields are zero).
        decoded = decode_records(ReceivedMessage, _common(), b.records())
        bodies.update(m.body for m in decoded)
    assert len(bodies) == 4 * per_thread


def _common() -> dict[str, object]:
    return {
        "broker": "b",
        "receipt_handle": "",
        "delivery_attempt": 0,
        "message_group": None,
        "invisible_until_ms": 0,
    }


def test_a_blocks_answer_gives_each_message_its_offsets_and_id(harness: Harness) -> None:
    futures = [harness.collector.add("orders", b"x" * n, None, (), None) for n in (10, 20, 30)]
    harness.on_loop(harness.collector.take_open)
    [block] = harness.handed
    block.queue = MessageQueue("orders", "broker-a", 3)
    assert block.records()  # sent for queue 3
    block.resolve(
        BlockAnswer(
            SendStatus.SEND_OK,
            "broker-a",
            0,
            "127.0.0.1:10911",
            bytes([10, 0, 0, 5]),
            10911,
            first_queue_offset=7,
            first_commitlog_offset=1_000,
            added_bytes=20,
            head_added_bytes=0,
            file_start_indexes=[2],
            file_start_offsets=[4_096],
            duplicate=False,
        )
    )
    results = [f.result(timeout=1) for f in futures]
    assert [r.queue_offset for r in results] == [7, 8, 9]
    first_size = 91 + 6 + 10 + 20  # header, topic, body, the broker's added bytes
    assert [r.commitlog_offset for r in results] == [1_000, 1_000 + first_size, 4_096]
    assert results[2].msg_id == "0A00000500002A9F0000000000001000"
    assert all(r.queue_id == 3 and r.ok for r in results)


def test_a_failed_block_fails_every_message_and_runs_their_callbacks(harness: Harness) -> None:
    futures = [harness.collector.add("orders", b"x", None, (), None) for _ in range(2)]
    harness.on_loop(harness.collector.take_open)
    seen: list[BaseException | None] = []
    futures[0].add_done_callback(lambda f: seen.append(f.exception()))
    harness.handed[0].fail(RuntimeError("broker gone"))
    assert [type(e) for e in seen] == [RuntimeError]
    with pytest.raises(RuntimeError, match="broker gone"):
        futures[1].result(timeout=1)


def test_futures_kept_by_the_million_cost_the_garbage_collector_nothing(
    harness: Harness,
) -> None:
    f = harness.collector.add("orders", b"x", None, (), None)
    assert not gc.is_tracked(f)
