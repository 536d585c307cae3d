"""Page settings (storage.pages, MappedFile.warm / lock): warming by one madvise per chunk that
leaves pages clean, its fallback where the kernel lacks MADV_POPULATE_*, a file closed under a
warming call, ``warm_mapped_file`` and ``mlock_commitlog``."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.conftest import tiny_config
from tests.store.test_warm import _cached_fraction
from tidemq.storage import Message, MessageStore, pages
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.warm import PageWarmer

pytestmark = pytest.mark.store

MiB = 1 << 20


def _write_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def _locked_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise AssertionError("no VmLck in /proc/self/status")


@pytest.fixture
def new_file(tmp_path: Path) -> Iterator[MappedFile]:
    f = MappedFile.create(str(tmp_path / "f"), 64 * MiB, 0)
    yield f
    f.close()


def test_warming_brings_the_range_into_the_page_cache_and_leaves_it_clean(
    new_file: MappedFile,
) -> None:
    f = new_file
    assert _cached_fraction(f.path, 4 * MiB, 20 * MiB) < 0.5
    before = _write_bytes()
    assert f.warm(4 * MiB, 16 * MiB)
    assert _cached_fraction(f.path, 4 * MiB, 20 * MiB) == 1.0
    # Past the kernel's readahead around the range (read_ahead_kb, 8 MiB here) nothing is read.
    assert _cached_fraction(f.path, 40 * MiB, 64 * MiB) < 0.5
    # A flush writes back every dirty page of the file: warming must have dirtied none, or the
    # zeros ahead of the writer would go to disk before the data does.
    os.fdatasync(f._fd)
    assert _write_bytes() - before < MiB


def test_warming_falls_back_to_reads_without_madv_populate(
    new_file: MappedFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages.POPULATE, "supported", False)  # a kernel before 5.14
    scratch = bytearray(4 * MiB)
    assert new_file.warm(0, 12 * MiB, scratch)
    assert _cached_fraction(new_file.path, 0, 12 * MiB) == 1.0


def test_a_file_closed_while_it_is_warmed_waits_for_the_call_and_is_not_warmed_again(
    new_file: MappedFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The closer waits for the call in flight (the file's I/O lock): no unmap under the kernel's
    # feet, no BufferError, and later calls see the file closed. The call is held inside the
    # native populate until the close is known to be waiting for it.
    in_call, release = threading.Event(), threading.Event()
    real_populate = pages.populate

    def held_populate(addr: int, length: int, *, write: bool) -> int:
        in_call.set()
        assert release.wait(10)
        return real_populate(addr, length, write=write)

    monkeypatch.setattr(pages, "populate", held_populate)
    results: list[bool] = []
    warming = threading.Thread(target=lambda: results.append(new_file.warm(0, 4 * MiB)))
    warming.start()
    assert in_call.wait(10)
    closing = threading.Thread(target=new_file.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive(), "close must wait for the populate call in flight"
    release.set()
    warming.join(10)
    closing.join(10)
    assert not warming.is_alive() and not closing.is_alive()
    assert results == [True]
    assert new_file.closed
    assert not new_file.warm(0, MiB)


def test_the_warmer_follows_the_writer() -> None:
    class FakeFile:
        size = 64 * MiB
        wrote = 0

        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []

        def warm(self, pos: int, length: int, scratch: bytearray | None = None) -> bool:
            self.calls.append((pos, length))
            return True

    f = FakeFile()
    w = PageWarmer(lambda: f, ahead_bytes=8 * MiB, chunk_bytes=4 * MiB)
    while w._step():
        pass
    assert f.calls == [(0, 4 * MiB), (4 * MiB, 4 * MiB)]
    f.wrote = 21 * MiB  # a burst overtook the warm range: on from the writer's chunk
    while w._step():
        pass
    assert f.calls[2:] == [(20 * MiB, 4 * MiB), (24 * MiB, 4 * MiB), (28 * MiB, 4 * MiB)]


def test_warm_mapped_file_populates_a_new_file_whole_as_it_is_created(tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path / "s",
        commitlog_file_size_bytes=16 * MiB,
        warm_ahead_bytes=0,  # no warming thread: only the creation populates
        warm_mapped_file=True,
    )
    with MessageStore(cfg) as s:
        s.put_messages([Message("t", b"x" * 1000)])
        first = s.commitlog.mfq.files[0]
        # Done in the creating thread, before the put returned.
        assert _cached_fraction(first.path, 0, first.size) == 1.0


def test_mlock_commitlog_locks_the_file_being_written_and_unlocks_the_one_before(
    tmp_path: Path,
) -> None:
    size = 256 << 10
    cfg = tiny_config(
        tmp_path / "s", commitlog_file_size_bytes=size, warm_ahead_bytes=0, mlock_commitlog=True
    )
    base = _locked_kib()
    with MessageStore(cfg) as s:
        s.put_messages([Message("t", b"x" * 1000)])
        files = s.commitlog.mfq.files
        assert [f.locked for f in files] == [True]
        assert _locked_kib() - base == size // 1024
        while len(files) < 3:  # two rolls
            s.put_messages([Message("t", b"x" * 1000) for _ in range(64)])
            files = s.commitlog.mfq.files
        assert [f.locked for f in files] == [False, False, True]
        assert _locked_kib() - base == size // 1024
        assert s.page_stats.mlock_failures == 0
    assert _locked_kib() == base


def test_an_mlock_refusal_is_counted_and_logged_once_never_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What RLIMIT_MEMLOCK below the file size does without CAP_IPC_LOCK.
    monkeypatch.setattr(pages, "mlock", lambda addr, length: errno.ENOMEM)
    cfg = tiny_config(tmp_path / "s", warm_ahead_bytes=0, mlock_commitlog=True)
    caplog.set_level(logging.WARNING, logger="tidemq.storage.pages")
    with MessageStore(cfg) as s:
        for _ in range(10):  # 4 KiB files: a roll every few puts, each one refused
            r = s.put_messages([Message("t", b"x" * 1000) for _ in range(3)])
            r.dispatched.result(10)
        stats = s.page_stats
        assert stats.mlock_failures == len(s.commitlog.mfq.files) > 3
        assert stats.mlock_error is not None and "ENOMEM" in stats.mlock_error
        assert not any(f.locked for f in s.commitlog.mfq.files)
    refusals = [r for r in caplog.records if "mlock" in r.getMessage()]
    assert len(refusals) == 1
