"""The transient store pool (``transient_store_pool_enable``): records go to pre-faulted write
buffers and reach the CommitLog files by commits; readers, dispatch and replication see only
what was committed, and the files end up holding exactly what the direct path writes."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import tiny_config
from tests.store.store_checks import verify_exactly
from tests.store.workload import Ack, plan_batch, put_batches, start_store, store_config
from tests.waiting import wait_until
from tidemq.storage import FlushMode, Message, MessageStore, PutResult, PutStatus
from tidemq.storage.errors import ConfigError
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.pages import PageCounters
from tidemq.storage.record import OK
from tidemq.storage.transient_pool import TransientStorePool

pytestmark = pytest.mark.store

FILE = 4096


def _messages(n: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    return [
        Message(
            "t",
            rng.randbytes(rng.randint(1, 900)),
            queue_id=rng.randrange(3),
            tags=rng.choice(["a", None]),
            keys=[f"k{seed}-{i}"],
            born_timestamp_ms=1_700_000_000_000,
        )
        for i in range(n)
    ]


def _commitlog_bytes(root: Path) -> dict[str, bytes]:
    d = root / "commitlog"
    return {name: (d / name).read_bytes() for name in sorted(os.listdir(d))}


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record gets the same store timestamp, so two stores can be compared byte for
    byte."""
    monkeypatch.setattr("tidemq.storage.commitlog.now_ms", lambda: 1_700_000_000_123)


@pytest.mark.usefixtures("fixed_clock")
@pytest.mark.parametrize(
    ("flush", "file_bytes", "batch"),
    [
        # Files of 4 KiB: dozens of rolls and blank markers, and two buffers reused across
        # them, each still holding an earlier file's bytes past the blank marker it ends with.
        # A batch that spans three files finds no third buffer: the files before give theirs up.
        (FlushMode.ASYNC, FILE, 6),
        (FlushMode.SYNC, FILE, 6),
        # Batches of about 100 KiB: copies into the buffers are pwrites to their memfds.
        (FlushMode.ASYNC, 1 << 20, 200),
    ],
    ids=["async-small", "sync-small", "async-large"],
)
def test_the_pool_leaves_the_same_bytes_on_disk_as_the_direct_path(
    tmp_path: Path, flush: FlushMode, file_bytes: int, batch: int
) -> None:
    batches = [_messages(random.Random(i).randint(1, batch), i) for i in range(60)]
    for name, pool in (("direct", False), ("pool", True)):
        cfg = tiny_config(
            tmp_path / name,
            flush_mode=flush,
            commitlog_file_size_bytes=file_bytes,
            transient_store_pool_enable=pool,
            transient_store_pool_buffers=2,
        )
        with MessageStore(cfg) as s:
            for b in batches:
                r = s.put_messages(b)
                assert r.wait(10) is PutStatus.PUT_OK
            if pool and file_bytes == FILE:
                assert s.page_stats.pool_misses > 0
    direct = _commitlog_bytes(tmp_path / "direct")
    assert len(direct) >= 3  # rolls either way
    assert _commitlog_bytes(tmp_path / "pool") == direct


def _held_store(tmp_path: Path, **overrides: Any) -> MessageStore:
    cfg = tiny_config(
        tmp_path / "s",
        commitlog_file_size_bytes=1 << 20,
        transient_store_pool_enable=True,
        transient_store_pool_buffers=2,
        **overrides,
    )
    return MessageStore(cfg).open()


def test_readers_see_nothing_of_a_put_until_it_is_committed(tmp_path: Path) -> None:
    s = _held_store(tmp_path)
    try:
        mfq = s.commitlog.mfq
        # Holding the commit lock keeps the commit thread (and the flusher, which commits
        # first) from copying anything; the commit step is then driven by hand.
        with mfq.commit_lock:
            put = s.put_messages(_messages(5, 1))
            end = s.commitlog.max_offset
            assert end > 0
            assert not put.durable.done()  # ASYNC with a pool: answered once committed
            assert s.commitlog.committed_offset == 0
            assert s.read_raw(0, 1 << 20) == b""
            assert list(s.log.iter_records(0, end, 0)) == []
            assert s.dispatch_now() == 0
            assert s.get_messages("t", 0, 0).messages == []
            assert s.max_offset("t", 0) == 0
            # The file itself holds nothing yet: a crash now would leave an empty log.
            with open(mfq.files[0].path, "rb") as f:
                assert f.read(end) == bytes(end)

            assert mfq.commit(0) == end  # the commit step, by hand

            assert s.commitlog.committed_offset == end
            raw = s.read_raw(0, 1 << 20)
            assert len(raw) == end
            assert [st for _, st, _ in s.log.iter_records(0, end, 0)] == [OK] * 5
            assert s.dispatch_now() == 5
            assert len(s.get_messages("t", 0, 0).messages) == s.max_offset("t", 0)
        assert put.durable.result(10) is PutStatus.PUT_OK
        put.dispatched.result(10)
    finally:
        s.close()


def test_a_sync_put_is_answered_only_after_its_commit_and_flush(tmp_path: Path) -> None:
    s = _held_store(tmp_path, flush_mode=FlushMode.SYNC)
    seen: list[tuple[int, int, bytes]] = []
    try:
        mfq = s.commitlog.mfq
        with mfq.commit_lock:
            put = s.put_messages(_messages(4, 2))
            end = s.commitlog.max_offset
            path = mfq.files[0].path

            def at_answer(_: object) -> None:
                # Runs where the future completes: what was committed and durable by then, and
                # what a fresh descriptor reads from the file.
                with open(path, "rb") as f:
                    seen.append((mfq.committed_offset, mfq.flushed_offset, f.read(end)))

            put.durable.add_done_callback(at_answer)
            assert not put.durable.done()
            expected = bytes(mfq.files[0]._buffer.mm[:end])  # type: ignore[union-attr]
        assert put.durable.result(10) is PutStatus.PUT_OK
        # Callbacks run just after the waiters wake.
        wait_until(lambda: len(seen) == 1, 10, "the future's callback")
        committed, flushed, on_disk = seen[0]
        assert committed >= end and flushed >= end
        assert on_disk == expected
        put.dispatched.result(10)
    finally:
        s.close()


def test_closing_commits_and_flushes_everything(tmp_path: Path) -> None:
    # No commit and no flush on their own for a minute: only the close can commit.
    cfg = store_config(
        tmp_path / "s",
        FlushMode.ASYNC,
        transient_store_pool_enable=True,
        commit_interval_ms=60_000,
        flush_interval_ms=60_000,
    )
    s = start_store(cfg)
    rng = random.Random(3)
    acks: list[Ack] = []
    with s._parts.put_lock:  # appended as a put appends, with nobody asking for a commit
        while len(acks) < 40:
            plan = plan_batch(rng, "c", len(acks))
            results = s.commitlog.put([p.message() for p in plan], cfg.max_message_body_bytes)
            acks += [Ack.of(p, r) for p, r in zip(plan, results, strict=True)]
    end = s.commitlog.max_offset
    assert s.commitlog.committed_offset < end
    s.close()
    s = start_store(cfg)
    try:
        assert s.recovery is not None and not s.recovery.abnormal
        assert s.recovery.end_offset == end
        verify_exactly(s, acks)
    finally:
        s.close()


def put_unanswered(s: MessageStore, n: int) -> list[PutResult]:
    """``n`` puts whose answers the caller does not wait for."""
    rng = random.Random(n)
    return [s.put_messages([p.message() for p in plan_batch(rng, "u", i * 10)]) for i in range(n)]


def test_buffers_go_back_to_the_pool_and_are_reused_across_file_rolls(tmp_path: Path) -> None:
    cfg = store_config(
        tmp_path / "s",
        FlushMode.ASYNC,
        transient_store_pool_enable=True,
        transient_store_pool_buffers=2,
    )
    s = start_store(cfg)
    try:
        pool = s._parts.pool
        assert pool is not None
        acks = put_batches(s, random.Random(4), "r", 200)
        files = len(s.commitlog.mfq.files)
        assert files > 10
        # Every file borrowed a buffer, and only two were ever made.
        assert (pool.made, pool.borrows, pool.misses) == (2, files, 0)
        assert s.commitlog.mfq.committed_offset == s.commitlog.max_offset
        # The file being written holds one; every full, committed file gave its back.
        last = s.commitlog.mfq.files[-1]
        holders = [f for f in s.commitlog.mfq.files if f.has_buffer]
        assert holders == ([] if last.is_full else [last])
        assert pool.free == 2 - len(holders)
        verify_exactly(s, acks)
    finally:
        s.close()
    assert pool.made == 0  # closed: unlocked and unmapped


def test_a_pool_of_one_buffer_keeps_every_put_in_order(tmp_path: Path) -> None:
    # No buffer is ever free at a roll: the previous file's pending bytes are committed and the
    # new file takes its buffer, the previous one going on directly.
    cfg = store_config(
        tmp_path / "s",
        FlushMode.ASYNC,
        transient_store_pool_enable=True,
        transient_store_pool_buffers=1,
    )
    s = start_store(cfg)
    try:
        acks = put_batches(s, random.Random(5), "o", 120)
        assert s.page_stats.pool_misses > 0
        verify_exactly(s, acks)
    finally:
        s.close()
    s = start_store(cfg)
    try:
        verify_exactly(s, acks)
    finally:
        s.close()


def test_truncation_keeps_wrote_committed_and_flushed_together(tmp_path: Path) -> None:
    cfg = store_config(tmp_path / "s", FlushMode.ASYNC, transient_store_pool_enable=True)
    s = start_store(cfg)
    try:
        acks = put_batches(s, random.Random(6), "t", 40)
        keep = [a for a in acks if a.end <= acks[len(acks) // 2].phy_offset]
        cut_at = max(a.end for a in keep)
        with s.commitlog.mfq.commit_lock:  # some bytes only in a buffer when the cut comes
            cut_puts = put_unanswered(s, 3)
            assert s.commitlog.committed_offset < s.commitlog.max_offset
            assert s.truncate_to(cut_at, "test") > 0
        # Committed before they were cut: answered, not left waiting for bytes that are gone.
        for put in cut_puts:
            assert put.durable.result(10) is PutStatus.PUT_OK
        mfq = s.commitlog.mfq
        assert s.commitlog.max_offset == mfq.committed_offset == cut_at
        last = mfq.files[-1]
        assert (last.wrote, last.committed, last.flushed) == (cut_at - last.base_offset,) * 3
        more = put_batches(s, random.Random(7), "after", 30)
        verify_exactly(s, keep + more)
    finally:
        s.close()


def test_replicated_bytes_are_committed_as_they_arrive(tmp_path: Path) -> None:
    master = start_store(store_config(tmp_path / "m", FlushMode.ASYNC))
    slave = start_store(
        store_config(tmp_path / "sl", FlushMode.ASYNC, transient_store_pool_enable=True)
    )
    try:
        acks = put_batches(master, random.Random(8), "x", 50)
        end = master.commitlog.max_offset
        off = 0
        while off < end:
            chunk = master.read_raw(off, 1000)  # chunks that split records
            off = slave.append_raw(off, chunk)
            # Readable (and acknowledgeable) at once, with nothing left in a buffer.
            assert slave.commitlog.committed_offset == off
            assert slave.read_raw(off - len(chunk), len(chunk)) == chunk
        assert slave.wait_dispatched(end, 30)
        verify_exactly(slave, acks)
    finally:
        master.close()
        slave.close()


def test_pool_settings_are_validated(tmp_path: Path) -> None:
    for bad in (
        {"transient_store_pool_buffers": 0},
        {"commit_interval_ms": 0},
        {"commit_least_pages": -1},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            tiny_config(tmp_path, **bad)


# ----------------------------------------------------------------------------- one file
@pytest.fixture
def pooled_file(tmp_path: Path) -> Iterator[tuple[MappedFile, TransientStorePool]]:
    pool = TransientStorePool(1, 64 << 10, PageCounters())
    pool.init()
    f = MappedFile.create(str(tmp_path / "f"), 64 << 10, 0)
    buf = pool.borrow()
    assert buf is not None
    f.attach_buffer(buf, pool.give_back)
    try:
        yield f, pool
    finally:
        f.close()
        pool.close()


def test_a_commit_writes_its_first_bytes_last(
    pooled_file: tuple[MappedFile, TransientStorePool], monkeypatch: pytest.MonkeyPatch
) -> None:
    f, _ = pooled_file
    f.write_at(0, b"\x01" * 100)
    f.wrote = 100
    f.commit()
    f.write_at(100, b"\x02" * 5000)
    f.wrote = 5100
    writes: list[tuple[int, int]] = []
    real = os.pwrite

    def recording(fd: int, data: Any, pos: int) -> int:
        writes.append((pos, len(data)))
        return real(fd, data, pos)

    monkeypatch.setattr(os, "pwrite", recording)
    assert f.commit() == 5100
    # Until the last write the new span starts with zeros: a kill part-way shows no record.
    assert writes == [(108, 4992), (100, 8)]
    assert bytes(f.mm[:5100]) == b"\x01" * 100 + b"\x02" * 5000


def test_least_pages_holds_back_a_small_commit_unless_the_file_is_full(
    pooled_file: tuple[MappedFile, TransientStorePool],
) -> None:
    f, pool = pooled_file
    f.write_at(0, b"\x03" * 5000)
    f.wrote = 5000
    assert f.commit(least_pages=4) == 0  # one new page of four
    assert f.committed == 0
    assert f.commit(least_pages=0) == 5000
    f._buffer.mm[6000:7000] = b"\xff" * 1000  # type: ignore[union-attr]  # an earlier file's
    f.write_blank_end(5000)
    assert pool.free == 0
    assert f.commit(least_pages=4) == f.size  # full: committed whatever least_pages says
    assert not f.has_buffer and pool.free == 1
    # Past the blank marker the file holds zeros, not the buffer's leftovers.
    assert bytes(f.mm[5008:]) == bytes(f.size - 5008)
