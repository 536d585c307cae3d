"""Walking archived CommitLog segments (pipeline.jobs.segments) over files the real store wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.segment_files import (
    FILE_SIZE,
    damaged_archive,
    write_segments,
)
from tidemq.pipeline.jobs.segments import (
    SegmentError,
    Split,
    data_end,
    find_segments,
    record_at,
    scan_split,
    splits,
)

pytestmark = pytest.mark.store


def _scan_all(paths: list[str], split_bytes: int) -> list:  # type: ignore[type-arg]
    return [r for s in splits(find_segments(paths), split_bytes) for r in scan_split(s)]


def test_every_record_is_found_once_whatever_the_split_size(tmp_path: Path) -> None:
    commitlog, appended = write_segments(tmp_path / "store")
    assert len(find_segments([str(commitlog)])) > 3  # the test needs several files
    expected = [(a.phy_offset, a.topic, a.queue_id, a.queue_offset, a.size) for a in appended]
    for split_bytes in (FILE_SIZE, 1000, 333):
        got = _scan_all([str(commitlog)], split_bytes)
        assert all(r.problem is None for r in got)
        assert [(r.phy_offset, r.topic, r.queue_id, r.queue_offset, r.size) for r in got] == (
            expected
        )
    first = _scan_all([str(commitlog)], FILE_SIZE)[0]
    assert (first.tags, first.keys, first.body_size) == ("t0", ("key-0",), len(appended[0].body))


@pytest.mark.parametrize("where", ["body", "size field", "topic"])
def test_damage_is_reported_at_its_file_and_offset_and_the_walk_goes_on(
    tmp_path: Path, where: str
) -> None:
    offsets = {"body": lambda _: 100, "size field": lambda _: 2, "topic": lambda v: v.size - 30}
    d = damaged_archive(tmp_path, 150, offsets[where])
    archive, appended, victim, path, at = d.archive, d.appended, d.victim, d.file, d.file_offset

    for split_bytes in (FILE_SIZE, 700):
        got = _scan_all([str(archive)], split_bytes)
        bad = [r for r in got if r.problem is not None]
        assert [(r.file, r.file_offset, r.phy_offset) for r in bad] == [
            (str(path), at, victim.phy_offset)
        ]
        assert bad[0].size == victim.size  # the span ends where the next record starts
        good = {r.phy_offset for r in got if r.problem is None}
        assert good == {a.phy_offset for a in appended} - {victim.phy_offset}


def test_globs_files_and_names(tmp_path: Path) -> None:
    commitlog, _ = write_segments(tmp_path / "store", messages=60)
    names = sorted(p.name for p in commitlog.iterdir())
    assert [s.base_offset for s in find_segments([str(commitlog / "0*")])] == [
        int(n) for n in names
    ]
    odd = tmp_path / "segment.bin"
    odd.write_bytes(b"")
    with pytest.raises(SegmentError, match="20-digit"):
        find_segments([str(odd)])
    with pytest.raises(SegmentError, match="no such file"):
        find_segments([str(tmp_path / "missing")])


def test_data_end_and_record_at(tmp_path: Path) -> None:
    commitlog, appended = write_segments(tmp_path / "store")
    segs = find_segments([str(commitlog)])
    last = segs[-1]
    in_last = [a for a in appended if a.phy_offset >= last.base_offset]
    assert data_end(last) == in_last[-1].phy_offset + in_last[-1].size - last.base_offset
    assert data_end(segs[0]) == segs[0].size_bytes  # full: ends with a blank marker
    a = appended[10]
    base = max(s.base_offset for s in segs if s.base_offset <= a.phy_offset)
    seg = next(s for s in segs if s.base_offset == base)
    rec = record_at(seg, a.phy_offset - base + 5)
    assert rec is not None and (rec.phy_offset, rec.size) == (a.phy_offset, a.size)
    assert record_at(last, last.size_bytes - 1) is None
    assert list(scan_split(Split(last, data_end(last), last.size_bytes))) == []
