"""Sync flush by group commit, its timeout, async flush, and what SYNC means for readers."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, wait
from pathlib import Path

import pytest

from tests.faults.disk import DiskFault
from tests.store.conftest import tiny_config
from tests.waiting import wait_until
from tidemq.storage import FlushMode, Message, MessageStore, PutStatus
from tidemq.storage.errors import DiskFailedError
from tidemq.storage.flush import FlushService

pytestmark = pytest.mark.store


class CountingFlush:
    """Stands in for the CommitLog's flush: counts msyncs and can stall like a sick disk."""

    def __init__(self) -> None:
        self.written = 0
        self.flushed = 0
        self.calls = 0
        self.stall = threading.Event()
        self.stall.set()

    def __call__(self, least_pages: int) -> int:
        self.stall.wait()
        self.calls += 1
        self.flushed = self.written
        return self.flushed


def service(fn: CountingFlush, timeout_ms: int = 5000) -> FlushService:
    return FlushService(
        fn,
        sync=True,
        interval_ms=50,
        least_pages=0,
        thorough_interval_ms=1000,
        sync_timeout_ms=timeout_ms,
        on_flushed=lambda _o: None,
        on_error=lambda _e: None,
    )


def test_one_flush_serves_a_whole_group() -> None:
    fn = CountingFlush()
    svc = service(fn)
    svc.start()
    try:
        fn.stall.clear()  # the disk is busy: requests pile up
        futures: list[Future[PutStatus]] = []
        for i in range(1, 65):
            fn.written = i * 100
            futures.append(svc.submit(i * 100))
        calls_before = fn.calls
        fn.stall.set()
        done, _ = wait(futures, timeout=10)
        assert len(done) == 64
        assert all(f.result() is PutStatus.PUT_OK for f in futures)
        assert fn.calls - calls_before <= 3  # a handful of msyncs, not 64
    finally:
        svc.stop()


def test_a_stalled_disk_answers_flush_disk_timeout_at_the_deadline() -> None:
    fn = CountingFlush()
    svc = service(fn, timeout_ms=200)
    svc.start()
    try:
        fn.stall.clear()
        fn.written = 10
        t0 = time.monotonic()
        fut = svc.submit(10)
        assert fut.result(timeout=5) is PutStatus.FLUSH_DISK_TIMEOUT
        assert 0.15 < time.monotonic() - t0 < 3
    finally:
        fn.stall.set()
        svc.stop()


def test_a_failed_flush_fails_the_waiting_request_and_every_later_one() -> None:
    """The flusher's part alone: the error reaches the waiter, later requests and on_error."""
    errors: list[BaseException] = []

    def broken(_least: int) -> int:
        raise OSError(5, "Input/output error")

    svc = FlushService(
        broken,
        sync=True,
        interval_ms=50,
        least_pages=0,
        thorough_interval_ms=1000,
        sync_timeout_ms=5000,
        on_flushed=lambda _o: None,
        on_error=errors.append,
    )
    svc.start()
    fut = svc.submit(1)
    with pytest.raises(OSError, match="Input/output error"):
        fut.result(timeout=5)
    svc.stop()
    assert errors and isinstance(errors[0], OSError)
    later = svc.submit(2)
    with pytest.raises(OSError, match="Input/output error"):
        later.result(timeout=1)


def test_flush_failure_fails_waiters_and_the_store_stops_writing(tmp_path: Path) -> None:
    """A real store in a child process whose fdatasync starts failing with EIO (the diskfault
    shim): the waiting put fails with a typed retriable DiskFailedError, the store refuses
    later puts and says it failed; reopened on a healthy disk, every acknowledged put is there."""
    root = tmp_path / "store"
    fault = DiskFault(tmp_path / "diskfault")
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("flush_fault_child.py")), str(root)],
        # The child imports tests.*: from the repository, whatever pytest's working directory.
        env={**fault.env, "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["before"] == ["PUT_OK"] * 5
    assert seen["failed"].startswith("DiskFailedError: CommitLog flush (fdatasync) failed: EIO")
    assert seen["later"].startswith("DiskFailedError: store failed and refuses writes")
    assert seen["failure"] == "disk_io" and seen["writable"] is False
    assert DiskFailedError.retriable
    with MessageStore(tiny_config(root)) as s:
        bodies = [m.body for m in s.get_messages("t", 0, 0, max_count=100).messages]
    assert bodies[:5] == [f"ok-{i}".encode() for i in range(5)]


def test_store_sync_flush_with_64_concurrent_writers(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s", commitlog_file_size_bytes=1 << 20, flush_mode=FlushMode.SYNC)
    with MessageStore(cfg) as s:
        results: list[PutStatus] = []
        lock = threading.Lock()

        def writer(n: int) -> None:
            for i in range(10):
                st = s.put_messages([Message("t", f"{n}-{i}".encode(), queue_id=n % 4)]).wait(10)
                with lock:
                    results.append(st)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [PutStatus.PUT_OK] * 640
        assert s.commitlog.mfq.flushed_offset == s.commitlog.max_offset
        # Visible to consumers once dispatched, which follows the flush.
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        assert sum(s.max_offset("t", q) for q in range(4)) == 640


def test_sync_flush_readers_see_only_flushed_records(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s", flush_mode=FlushMode.SYNC)
    with MessageStore(cfg) as s:
        with s._parts.flush_lock:  # the flusher cannot finish while we hold this
            r = s.put_messages([Message("t", b"not yet durable")])
            s.dispatch_now()
            assert s.max_offset("t", 0) == 0  # ReputMessageServiceTest: not past flushedWhere
            assert not r.durable.done()
        assert r.wait(10) is PutStatus.PUT_OK
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        assert s.get_messages("t", 0, 0).messages[0].body == b"not yet durable"


def test_async_flush_answers_at_once_and_flushes_in_the_background(tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path / "s", commitlog_file_size_bytes=1 << 20, flush_interval_ms=20, flush_least_pages=0
    )
    with MessageStore(cfg) as s:
        r = s.put_messages([Message("t", b"z" * 10_000)])
        assert r.durable.done() and r.wait() is PutStatus.PUT_OK
        wait_until(
            lambda: s.commitlog.mfq.flushed_offset >= s.commitlog.max_offset,
            10,
            "the async flusher to flush",
        )
