"""IndexService, the directory of index files: rolling to a new file when one is full, queries
across files, replay that rewrites the same bytes, reopening, trimming and deleting old files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.index_checks import T, build, contents, keys_st
from tidemq.storage.index_service import IndexService

pytestmark = pytest.mark.store


def test_full_file_rolls_with_previous_end(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path / "index"), 4, 4, now_ms=lambda: T)
    svc.load()
    assert svc.end_phy_offset == -1
    svc.build_index("t", 0, T, [])
    assert svc.files == []  # created lazily, by the first key
    svc.build_index("t", 100, T, ["a", "b"])
    # The third key fills the file, the fourth goes to a new one.
    svc.build_index("t", 200, T + 5000, ["c", "d"])
    files = svc.files
    assert [os.path.basename(f.path) for f in files] == ["20231114221320123", "20231114221320124"]
    first, second = files
    assert first.is_full
    assert (first.end_phy_offset, first.end_timestamp) == (200, T + 5000)
    assert (second.begin_phy_offset, second.begin_timestamp) == (200, T + 5000)
    assert second.index_count == 2
    svc.build_index("t", 300, T + 9000, ["e"])
    assert svc.end_phy_offset == 300
    assert svc.query("t", "d", 10, 0, T + 9000) == [200]
    assert svc.query("t", "c", 10, 0, T + 9000) == [200]
    assert svc.query("t", "a", 10, 0, T + 9000) == [100]
    # The newer file begins at T+5000, before the range, so the walk stops there.
    assert svc.query("t", "a", 10, T + 6000, T + 9000) == []
    assert svc.query("t", "e", 10, T + 6000, T + 9000) == [300]
    svc.close()


def test_query_respects_max_num_across_files(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path / "index"), 4, 3)
    svc.load()
    for i in range(7):
        svc.build_index("t", i * 10, T + i * 1000, ["same"])
    assert len(svc.files) == 4
    assert svc.query("t", "same", 100, 0, T + 10_000) == [60, 50, 40, 30, 20, 10, 0]
    assert svc.query("t", "same", 3, 0, T + 10_000) == [60, 50, 40]
    assert svc.query("other", "same", 3, 0, T + 10_000) == []
    svc.close()


def messages(n: int) -> list[tuple[int, int, list[str]]]:
    return [(i * 100, T + i * 700, [f"u{i}", f"k{i % 7}", "" if i % 3 else "x"]) for i in range(n)]


def test_replay_is_idempotent(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path / "index"), 8, 16)
    svc.load()
    build(svc, messages(40))
    before = contents(svc)
    names = [f.path for f in svc.files]
    build(svc, messages(40))
    build(svc, messages(40)[10:20])
    assert contents(svc) == before
    assert [f.path for f in svc.files] == names
    svc.close()


def test_replay_completes_a_message_cut_between_keys(tmp_path: Path) -> None:
    msgs = messages(30)
    ref = IndexService(str(tmp_path / "ref"), 8, 16)
    ref.load()
    build(ref, msgs)
    cut = IndexService(str(tmp_path / "cut"), 8, 16)
    cut.load()
    build(cut, msgs[:29])
    phy, ts, keys = msgs[29]
    cut.build_index("orders", phy, ts, keys[:1])
    build(cut, msgs)
    assert contents(cut) == contents(ref)
    ref.close()
    cut.close()


def test_reopen_keeps_answers(tmp_path: Path) -> None:
    d = str(tmp_path / "index")
    svc = IndexService(d, 8, 16)
    svc.load()
    build(svc, messages(40))
    answers = [svc.query("orders", f"k{i}", 64, 0, T + 10**6) for i in range(7)]
    end = svc.end_phy_offset
    n_files = len(svc.files)
    svc.close()
    again = IndexService(d, 8, 16)
    again.load()
    assert len(again.files) == n_files
    assert again.end_phy_offset == end == 3900
    assert [again.query("orders", f"k{i}", 64, 0, T + 10**6) for i in range(7)] == answers
    assert answers[0][:2] == [3500, 2800]
    again.close()


def test_delete_files_below_keeps_newest(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path / "index"), 8, 16)
    svc.load()
    build(svc, messages(40))
    files = svc.files
    assert len(files) >= 4
    assert svc.delete_files_below(files[1].end_phy_offset) == 1
    assert not os.path.exists(files[0].path)
    assert svc.delete_files_below(10**9) == len(files) - 2
    assert [f.path for f in svc.files] == [files[-1].path]
    assert svc.query("orders", "u39", 10, 0, T + 10**6) == [3900]
    svc.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_index_num=st.integers(2, 6),
    msgs=st.lists(keys_st, max_size=20),
    data=st.data(),
)
def test_service_trim_to_exactness_property(
    max_index_num: int, msgs: list[list[str]], data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(msgs)))
    with tempfile.TemporaryDirectory() as d:
        svc = IndexService(d, 3, max_index_num)
        svc.load()
        timed = [(10 * i, T + 1500 * i, keys) for i, keys in enumerate(msgs)]
        build(svc, timed[:k])
        snap, end = contents(svc), svc.end_phy_offset
        build(svc, timed[k:])
        after = contents(svc)
        svc.trim_to(10 * k)
        assert contents(svc) == snap
        assert svc.end_phy_offset == end
        build(svc, timed[k:])  # and the index grows back to the same bytes
        assert contents(svc) == after
        svc.close()


def test_load_removes_leftover_tmp(tmp_path: Path) -> None:
    d = tmp_path / "index"
    d.mkdir()
    (d / "20231114221320123.tmp").write_bytes(bytes(10))
    (d / "notes.txt").write_text("kept")
    svc = IndexService(str(d), 4, 4)
    svc.load()
    assert svc.files == []
    assert sorted(os.listdir(d)) == ["notes.txt"]
    svc.close()
