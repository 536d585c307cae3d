"""Recovery's index helper process (storage.index_rebuild).

A recovery that re-dispatches much of the log hands indexing to a second process. Users rely on
three things: the index it builds is the one the store would have built itself, byte for byte;
a helper that dies or fails costs time, never keys; and the store stays locked until the helper
has stopped writing, even when the recovering process dies first.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.store.store_checks import verify_exactly
from tests.store.workload import Ack, put_batches, start_store, store_config
from tidemq.storage import dispatch
from tidemq.storage.check import check_store
from tidemq.storage.config import StoreConfig
from tidemq.storage.errors import ConfigError, StoreLockedError
from tidemq.storage.index_rebuild import IndexRebuildWorker
from tidemq.storage.index_service import IndexService
from tidemq.storage.lock import StoreLock
from tidemq.storage.store import MessageStore

pytestmark = pytest.mark.store

COUNT = 160  # messages with keys: the tiny index layout (8 slots, 32 entries) rolls many files


def build_without_checkpoint(root: Path, seed: int) -> list[Ack]:
    """A store closed cleanly whose checkpoint is then lost: recovery re-dispatches it all."""
    s = start_store(store_config(root))
    try:
        acks = put_batches(s, random.Random(seed), "m", COUNT)
    finally:
        s.close()
    (root / "checkpoint").unlink()
    return acks


def index_bytes(root: Path) -> list[bytes]:
    """Every index file's contents, oldest first (names are creation times, so they differ)."""
    d = root / "index"
    return [(d / name).read_bytes() for name in sorted(os.listdir(d))]


def queue_bytes(root: Path) -> dict[str, bytes]:
    top = root / "consumequeue"
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def recover_in_process(tmp_path: Path, root: Path) -> tuple[list[bytes], dict[str, bytes]]:
    """What the store itself makes of a copy of ``root``: the reference."""
    twin = tmp_path / "in-process"
    shutil.copytree(root, twin)
    s = start_store(store_config(twin, recovery_index_helper_min_bytes=None))
    try:
        assert s.recovery is not None
        assert not s.recovery.index_helper
    finally:
        s.close()
    return index_bytes(twin), queue_bytes(twin)


def open_with_helper(root: Path, after_bytes: int = 0) -> MessageStore:
    return start_store(store_config(root, recovery_index_helper_min_bytes=after_bytes))


@pytest.mark.parametrize("from_start", [True, False], ids=["helper-only", "store-then-helper"])
def test_helper_builds_the_index_the_store_would_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, from_start: bool
) -> None:
    """The helper takes over at the start of the pass, or halfway through the log with the
    store's own dispatch having indexed the first half."""
    root = tmp_path / "store"
    acks = build_without_checkpoint(root, seed=1)
    want_index, want_queues = recover_in_process(tmp_path, root)
    assert len(want_index) > 3

    monkeypatch.setattr(dispatch, "_INDEX_BATCH", 8)  # many frames down the pipe
    halfway = max(a.phy_offset for a in acks) // 2
    s = open_with_helper(root, 0 if from_start else halfway)
    try:
        assert s.recovery is not None
        assert s.recovery.index_helper
        assert s.recovery.index_helper_failure is None
        assert s.recovery.records_redispatched == COUNT
    finally:
        s.close()
    assert index_bytes(root) == want_index
    assert queue_bytes(root) == want_queues
    assert check_store(str(root)).ok

    s = start_store(store_config(root))
    try:
        verify_exactly(s, acks)  # every key is found through the helper's files
        more = put_batches(s, random.Random(2), "after", 20)  # and the store indexes on
        for a in more:
            assert [m.phy_offset for m in s.query_by_key(a.topic, a.key)] == [a.phy_offset]
    finally:
        s.close()


@pytest.mark.parametrize("kill_after", [0, 1, 4])
def test_helper_killed_midway_costs_no_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_after: int
) -> None:
    """SIGKILL the helper after it was handed ``kill_after`` batches (it may be in the middle of
    one): recovery notices, indexes the rest itself, and ends with the same bytes."""
    root = tmp_path / "store"
    acks = build_without_checkpoint(root, seed=4)
    want_index, want_queues = recover_in_process(tmp_path, root)

    monkeypatch.setattr(dispatch, "_INDEX_BATCH", 8)  # many batches, so there is a "midway"
    real_submit = IndexRebuildWorker.submit
    handed: list[int] = []

    def submit_then_kill(
        self: IndexRebuildWorker, messages: Sequence[tuple[str, int, int, Sequence[bytes]]]
    ) -> None:
        if len(handed) == kill_after:
            os.kill(self.pid, signal.SIGKILL)
        handed.append(len(messages))
        real_submit(self, messages)

    monkeypatch.setattr(IndexRebuildWorker, "submit", submit_then_kill)
    s = open_with_helper(root)
    try:
        assert s.recovery is not None
        assert s.recovery.index_helper
        assert s.recovery.index_helper_failure is not None
        assert len(handed) > kill_after
        verify_exactly(s, acks)
    finally:
        s.close()
    assert index_bytes(root) == want_index
    assert queue_bytes(root) == want_queues
    assert check_store(str(root)).ok


def test_helper_that_cannot_start_leaves_indexing_to_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    acks = build_without_checkpoint(root, seed=5)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    s = open_with_helper(root)
    try:
        assert s.recovery is not None
        assert not s.recovery.index_helper
        verify_exactly(s, acks)
    finally:
        s.close()


def test_helper_reports_its_own_failure(tmp_path: Path) -> None:
    """An index the helper cannot open (here: another layout) is answered with the error's type,
    and nothing is written."""
    directory = tmp_path / "index"
    service = IndexService(str(directory), 8, 32)
    service.load()
    service.build_index("T", 0, 1_700_000_000_000, ["k"])
    service.close()
    before = index_bytes(tmp_path)

    worker = IndexRebuildWorker(str(directory), 16, 32)
    worker.submit([("T", 100, 1_700_000_000_000, [b"k2"])])
    failure = worker.finish()
    assert failure is not None
    assert "CorruptStoreError" in failure
    assert index_bytes(tmp_path) == before


def test_store_stays_locked_while_an_orphaned_helper_runs(tmp_path: Path) -> None:
    """The helper inherits the store lock: if the recovering process dies, no new store process
    can open the directory (and write the index) until the helper has exited."""
    root = tmp_path / "store"
    root.mkdir()
    (root / "index").mkdir()
    fd = os.open(root / "lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    worker = IndexRebuildWorker(str(root / "index"), 8, 32, hold_fd=fd)
    os.close(fd)  # the recovering process is gone; only the helper holds the lock now
    with pytest.raises(StoreLockedError):
        StoreLock(str(root)).acquire()
    assert worker.finish() is None
    lock = StoreLock(str(root))
    lock.acquire()
    lock.release()


def test_helper_threshold_is_validated() -> None:
    with pytest.raises(ConfigError, match="recovery_index_helper_min_bytes"):
        StoreConfig("/tmp/x", recovery_index_helper_min_bytes=-1)
