"""Page-cache warming ahead of the CommitLog writer (storage.warm)."""

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from tests.store.conftest import tiny_config
from tests.waiting import wait_until
from tidemq.storage import Message, MessageStore
from tidemq.storage.warm import next_warm_range

MiB = 1 << 20


@pytest.mark.parametrize(
    ("wrote", "warmed", "expected"),
    [
        (0, 0, 0),  # a new file: from its start
        (5 * MiB, 0, 4 * MiB),  # behind the writer is wasted: from the writer's chunk
        (5 * MiB, 8 * MiB, 8 * MiB),  # continue where warming stopped
        (5 * MiB, 21 * MiB, -1),  # 16 MiB ahead is warm already
        (30 * MiB, 32 * MiB, -1),  # the end of the file caps the window
    ],
)
def test_next_warm_range_keeps_a_window_ahead_of_the_writer(
    wrote: int, warmed: int, expected: int
) -> None:
    assert next_warm_range(wrote, warmed, 32 * MiB, 16 * MiB, 4 * MiB) == expected


def _cached_fraction(path: str, start: int, end: int) -> float:
    """Share of the file's pages in [start, end) that are in the page cache (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, end - start, offset=start)  # mapped, never touched
        try:
            anchor = ctypes.c_char.from_buffer(mm)
            pages = (end - start) // page
            vec = (ctypes.c_ubyte * pages)()
            rc = libc.mincore(
                ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(end - start), vec
            )
            del anchor
            assert rc == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec) / pages
        finally:
            mm.close()
    finally:
        os.close(fd)


def test_the_window_ahead_of_the_writer_is_in_the_page_cache_before_it_is_written(
    tmp_path: Path,
) -> None:
    cfg = tiny_config(tmp_path / "s", commitlog_file_size_bytes=64 * MiB, warm_ahead_bytes=16 * MiB)
    store = MessageStore(cfg).open()
    try:
        store.put_messages([Message("t", b"x" * 1000) for _ in range(10)])
        last = store.commitlog.mfq.last_file
        assert last is not None and last.wrote < MiB
        wait_until(
            lambda: _cached_fraction(last.path, MiB, 16 * MiB) == 1.0,
            10,
            "the 16 MiB ahead of the writer to be in the page cache",
        )
        # Far beyond the window nothing was read: warming follows the writer, not the file.
        assert _cached_fraction(last.path, 40 * MiB, 64 * MiB) < 0.5
    finally:
        store.close()


def test_warming_off_reads_nothing(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s", commitlog_file_size_bytes=64 * MiB, warm_ahead_bytes=0)
    store = MessageStore(cfg).open()
    try:
        store.put_messages([Message("t", b"x" * 1000)])
        assert store._lifecycle.warmer is None
        last = store.commitlog.mfq.last_file
        assert last is not None
        assert _cached_fraction(last.path, 8 * MiB, 24 * MiB) < 0.5
    finally:
        store.close()


def test_warming_asked_for_at_run_time_starts_pauses_and_resumes(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s", commitlog_file_size_bytes=64 * MiB, warm_ahead_bytes=0)
    with MessageStore(cfg) as store:
        store.put_messages([Message("t", b"x" * 1000)]).wait()
        last = store.commitlog.mfq.last_file
        assert last is not None
        path = last.path
        assert _cached_fraction(path, 32 * MiB, 40 * MiB) == 0.0  # nothing warms by default
        store.set_warm_ahead(48 * MiB)
        wait_until(
            lambda: _cached_fraction(path, 32 * MiB, 40 * MiB) == 1.0, 10, "warming to start"
        )
        store.set_warm_ahead(0)
        warmer = store._lifecycle.warmer
        assert warmer is not None and warmer.ahead_bytes == 0
        store.put_messages([Message("t", b"x" * 1000)]).wait()
        assert _cached_fraction(path, 56 * MiB, 64 * MiB) == 0.0  # paused: no further
        with pytest.raises(ValueError, match=">= 0"):
            store.set_warm_ahead(-1)
