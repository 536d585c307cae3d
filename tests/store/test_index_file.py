"""IndexFile and IndexService: exact bytes, chains, trimming, torn puts and killed writers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.index_file import IndexFile, index_file_size
from tidemq.storage.index_service import IndexService

pytestmark = pytest.mark.store

REPO = Path(__file__).resolve().parents[2]
T = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z
HELLO = 99162322  # "hello".hashCode(), slot 2 of 4
WORLD = 113318802  # "world".hashCode(), slot 2 of 4 as well
AA = 2112  # "Aa".hashCode() == "BB".hashCode(), slot 0 of 4


def i32(v: int) -> bytes:
    return v.to_bytes(4, "big", signed=True)


def i64(v: int) -> bytes:
    return v.to_bytes(8, "big", signed=True)


def entry(key_hash: int, phy: int, diff: int, prev: int) -> bytes:
    return i32(key_hash) + i64(phy) + i32(diff) + i32(prev)


def header(*fields: int) -> bytes:
    """begin/end timestamp and begin/end offset as int64, hashSlotCount and indexCount as int32."""
    assert len(fields) == 6
    return b"".join(map(i64, fields[:4])) + i32(fields[4]) + i32(fields[5])


def contents(svc: IndexService) -> list[bytes]:
    return [Path(f.path).read_bytes() for f in svc.files]


def check_consistent(path: str, slot_num: int, max_index_num: int) -> None:
    """Offline invariants, read from raw bytes: every committed entry is reachable from its slot
    exactly once, nothing lies beyond indexCount, and hashSlotCount counts the used slots."""
    raw = Path(path).read_bytes()
    count = int.from_bytes(raw[36:40], "big")
    slots = [int.from_bytes(raw[40 + 4 * i : 44 + 4 * i], "big") for i in range(slot_num)]
    base = 40 + slot_num * 4

    def field(n: int, lo: int, hi: int) -> int:
        return int.from_bytes(raw[base + n * 20 + lo : base + n * 20 + hi], "big", signed=True)

    assert int.from_bytes(raw[32:36], "big") == sum(1 for s in slots if s)
    seen: list[int] = []
    for s, head in enumerate(slots):
        n = head
        while n:
            assert 0 < n < count
            assert field(n, 0, 4) % slot_num == s
            seen.append(n)
            prev = field(n, 16, 20)
            assert prev < n
            n = prev
    assert sorted(seen) == list(range(1, count))
    assert raw[base + count * 20 :] == bytes((max_index_num - count) * 20)


def test_layout_size_arithmetic() -> None:
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040
    assert index_file_size(16, 8) == 40 + 16 * 4 + 8 * 20


def test_golden_bytes(tmp_path: Path) -> None:
    path = str(tmp_path / "idx")
    f = IndexFile.create(path, 4, 4, 0, 0)
    assert Path(path).read_bytes() == header(0, 0, 0, 0, 0, 1) + bytes(16) + bytes(80)

    assert f.put_key("hello", 100, T)
    assert f.put_key("Aa", 200, T + 61_000)
    # 61.5 s after the first entry: recorded, and so reported as the end, as 61 whole seconds.
    assert f.put_key("world", 300, T + 61_500)
    assert f.is_full
    assert not f.put_key("BB", 400, T + 70_000)
    f.close()

    expected = (
        header(T, T + 61_000, 100, 300, 2, 4)
        + i32(2)  # slot 0: "Aa"
        + i32(0)
        + i32(3)  # slot 2: "world", whose prev is "hello"
        + i32(0)
        + bytes(20)  # entry 0 is never used
        + entry(HELLO, 100, 0, 0)
        + entry(AA, 200, 61, 0)
        + entry(WORLD, 300, 61, 1)
    )
    assert Path(path).read_bytes() == expected


def test_collisions_share_a_chain(tmp_path: Path) -> None:
    f = IndexFile.create(str(tmp_path / "idx"), 4, 16, 0, 0)
    f.put_key("hello", 10, T)
    f.put_key("world", 20, T + 1000)
    f.put_key("hello", 30, T + 2000)
    f.put_key("Aa", 40, T + 3000)
    f.put_key("BB", 50, T + 4000)
    assert f.hash_slot_count == 2
    everything = (0, T + 10_000)
    assert f.select("hello", *everything, 10) == [30, 10]
    assert f.select("world", *everything, 10) == [20]
    # Equal Java hashes cannot be told apart here; the caller compares the real keys.
    assert f.select("Aa", *everything, 10) == [50, 40]
    assert f.select("BB", *everything, 10) == [50, 40]
    assert f.select("hello", *everything, 1) == [30]
    assert f.select("nope", *everything, 10) == []
    assert [e[0] for e in f.iter_entries()] == [1, 2, 3, 4, 5]
    assert list(f.iter_entries())[1] == (2, WORLD, 20, T + 1000)
    f.close()


def test_time_range_filtering(tmp_path: Path) -> None:
    f = IndexFile.create(str(tmp_path / "idx"), 16, 16, 0, 0)
    for i in range(4):
        f.put_key("k", 100 * i, T + 10_000 * i)
    assert f.select("k", T + 10_000, T + 20_000, 10) == [200, 100]
    assert f.select("k", T + 10_001, T + 20_000, 10) == [200]
    assert f.select("k", T + 30_001, T + 90_000, 10) == []
    assert f.select("k", 0, T - 1, 10) == []
    assert f.select("k", 0, T + 30_000, 0) == []
    f.close()


def test_wrong_size_or_header_is_corrupt(tmp_path: Path) -> None:
    bad = tmp_path / "idx"
    bad.write_bytes(bytes(100))
    with pytest.raises(CorruptStoreError, match=str(bad)):
        IndexFile.open(str(bad), 16, 8)
    bad.write_bytes(bytes(index_file_size(16, 8)))  # right size, indexCount 0
    with pytest.raises(CorruptStoreError, match=str(bad)):
        IndexFile.open(str(bad), 16, 8)
    d = tmp_path / "index"
    d.mkdir()
    (d / "20231114221320123").write_bytes(bytes(7))
    with pytest.raises(CorruptStoreError, match="20231114221320123"):
        IndexService(str(d), 16, 8).load()


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


def build(svc: IndexService, msgs: list[tuple[int, int, list[str]]]) -> None:
    for phy, ts, keys in msgs:
        svc.build_index("orders", phy, ts, keys)


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


def snapshot_then_trim(
    path: str, slot_num: int, max_index_num: int, msgs: list[list[str]], k: int
) -> None:
    """Put ``msgs`` (message i at offset 10*i), then trim to message k: the bytes must be exactly
    those seen right after message k-1."""
    f = IndexFile.create(path, slot_num, max_index_num, 0, 0)
    snap = b""
    for i, keys in enumerate(msgs):
        if i == k:
            snap = Path(path).read_bytes()
        for key in keys:
            f.put_key(key, 10 * i, T + 777 * i)
    if k >= len(msgs):
        snap = Path(path).read_bytes()
    f.trim_to(10 * k)
    assert Path(path).read_bytes() == snap
    check_consistent(path, slot_num, max_index_num)
    f.close()


def test_trim_to_restores_exact_bytes(tmp_path: Path) -> None:
    msgs = [["hello"], ["world", "Aa"], ["hello", "BB"], ["x"], ["world"], ["hello", "y", "z"]]
    for k in range(1, len(msgs) + 1):
        snapshot_then_trim(str(tmp_path / f"idx{k}"), 4, 32, msgs, k)


keys_st = st.lists(st.sampled_from(["a", "b", "c", "Aa", "BB", "hello", "world", "q"]), max_size=3)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slot_num=st.integers(1, 9),
    max_index_num=st.integers(2, 30),
    first=st.lists(st.sampled_from(["a", "hello"]), min_size=1, max_size=2),
    rest=st.lists(keys_st, max_size=25),
    data=st.data(),
)
def test_trim_to_exactness_property(
    slot_num: int, max_index_num: int, first: list[str], rest: list[list[str]], data: st.DataObject
) -> None:
    msgs = [first, *rest]
    k = data.draw(st.integers(1, len(msgs)))
    with tempfile.TemporaryDirectory() as d:
        snapshot_then_trim(os.path.join(d, "idx"), slot_num, max_index_num, msgs, k)


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


def splice(old: bytes, new: bytes, regions: list[tuple[int, int]]) -> bytes:
    out = bytearray(old)
    for lo, hi in regions:
        out[lo:hi] = new[lo:hi]
    return bytes(out)


@pytest.mark.parametrize("stage", ["half_entry", "entry", "slot", "header_body"])
@pytest.mark.parametrize(
    "key", ["world", "Aa"]
)  # a slot that already has a chain, and an empty one
def test_repair_torn_put(tmp_path: Path, stage: str, key: str) -> None:
    path = str(tmp_path / "idx")
    f = IndexFile.create(path, 4, 8, 0, 0)
    f.put_key("hello", 100, T)
    f.put_key("hello", 200, T + 1000)
    f.close()
    before = Path(path).read_bytes()
    f = IndexFile.open(path, 4, 8)
    f.put_key(key, 300, T + 5000)
    f.close()
    after = Path(path).read_bytes()

    entry3 = 40 + 4 * 4 + 3 * 20
    slot = 40 + 4 * (2 if key == "world" else 0)
    regions = {
        "half_entry": [(entry3, entry3 + 10)],
        "entry": [(entry3, entry3 + 20)],
        "slot": [(entry3, entry3 + 20), (slot, slot + 4)],
        "header_body": [(entry3, entry3 + 20), (slot, slot + 4), (0, 36)],
    }[stage]
    Path(path).write_bytes(splice(before, after, regions))

    f = IndexFile.open(path, 4, 8)
    assert f.index_count == 3
    assert f.repair_torn() == 1
    assert f.select(key, 0, T + 10_000, 10) == []
    assert f.select("hello", 0, T + 10_000, 10) == [200, 100]
    f.close()
    assert Path(path).read_bytes() == before
    f = IndexFile.open(path, 4, 8)
    assert f.repair_torn() == 0
    f.put_key(key, 300, T + 5000)  # the replay writes what the torn put meant to
    f.close()
    assert Path(path).read_bytes() == after


def test_repair_torn_first_put(tmp_path: Path) -> None:
    path = str(tmp_path / "idx")
    IndexFile.create(path, 4, 8, 50, T - 9000).close()
    before = Path(path).read_bytes()
    f = IndexFile.open(path, 4, 8)
    f.put_key("hello", 100, T)
    f.close()
    after = Path(path).read_bytes()
    Path(path).write_bytes(splice(before, after, [(40, 40 + 16 + 40), (0, 36)]))

    f = IndexFile.open(path, 4, 8)
    assert f.repair_torn() == 1
    assert f.index_count == 1
    assert f.hash_slot_count == 0
    assert f.select("hello", 0, T + 10_000, 10) == []
    f.close()
    # The begin fields keep the torn put's values (documented); slots and entries are clean.
    assert Path(path).read_bytes()[36:] == before[36:]
    f = IndexFile.open(path, 4, 8)
    f.put_key("hello", 100, T)
    f.close()
    assert Path(path).read_bytes() == after


@pytest.mark.parametrize("undone", [0, 1, 2])
def test_trim_killed_halfway_is_finished_by_repair(tmp_path: Path, undone: int) -> None:
    path = str(tmp_path / "idx")
    f = IndexFile.create(path, 4, 16, 0, 0)
    for i, key in enumerate(["hello", "Aa", "world", "hello", "BB", "world"]):
        f.put_key(key, 10 * i, T + 1000 * i)
    f.close()
    before = Path(path).read_bytes()
    f = IndexFile.open(path, 4, 16)
    assert f.trim_to(30) == 3
    f.close()
    after = Path(path).read_bytes()
    # trim_to writes the header, then undoes entries 6, 5, 4 (slot, then entry bytes) in turn.
    base = 40 + 16
    slot_of = {6: 2, 5: 0, 4: 2}
    regions = [(0, 40)]
    for n in [6, 5, 4][:undone]:
        regions += [(40 + 4 * slot_of[n], 44 + 4 * slot_of[n]), (base + 20 * n, base + 20 * n + 20)]
    Path(path).write_bytes(splice(before, after, regions))
    f = IndexFile.open(path, 4, 16)
    assert f.repair_torn() == 3 - undone
    f.close()
    assert Path(path).read_bytes() == after


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


# The child indexes messages and is SIGKILLed: at a random moment, or by a failpoint that swaps
# one of the module's Struct objects for one that kills the process right after a given write.
CHILD = """
import os, signal, sys
import tidemq.storage.index_file as m
from tidemq.storage.index_service import IndexService

class KillAfter:
    def __init__(self, inner, calls):
        self.inner, self.left = inner, calls
    def __getattr__(self, name):
        return getattr(self.inner, name)
    def pack_into(self, *args):
        self.inner.pack_into(*args)
        self.left -= 1
        if self.left == 0:
            os.kill(os.getpid(), signal.SIGKILL)

# SIGKILL right after the calls-th committed write (m._store) of the given kinds:
# "header_body" (offset 0), "count" (indexCount) or "slot".
def kill_after_stores(calls, kinds):
    real, left = m._store, [calls]
    def store(mm, pos, data):
        real(mm, pos, data)
        kind = "header_body" if pos == 0 else "count" if pos == m._INDEX_COUNT_AT else "slot"
        if kind in kinds:
            left[0] -= 1
            if left[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    m._store = store

directory, n, stage, at = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if stage == "entry":
    m._ENTRY = KillAfter(m._ENTRY, at)
elif stage == "slot":
    kill_after_stores(at, {"slot"})
elif stage == "header_body":
    # The header is written once per message (three keys).
    kill_after_stores(max(1, at // 3), {"header_body"})
svc = IndexService(directory, SLOTS, ENTRIES)
svc.load()
T = 1_700_000_000_123
for i in range(n):
    svc.build_index("orders", i * 100, T + i * 333, [f"u{i}", f"k{i % 11}", f"m{i % 5}"])
    if i % 25 == 0:
        print(i, flush=True)
if stage == "trim":
    kill_after_stores(2, {"count", "slot"})  # indexCount, the commit point, then one slot back
    svc.trim_to(at * 100)
svc.close()
print("done", flush=True)
"""
SLOTS, ENTRIES = 16, 50  # 49 entries a file: messages of 3 keys straddle files


def crash_messages(n: int) -> list[tuple[int, int, list[str]]]:
    return [(i * 100, T + i * 333, [f"u{i}", f"k{i % 11}", f"m{i % 5}"]) for i in range(n)]


def run_child(d: str, n: int, stage: str, at: int, kill_at_line: int | None) -> int:
    """Run the child to its end, its failpoint, or our SIGKILL; returns its exit status."""
    child = CHILD.replace("SLOTS, ENTRIES", f"{SLOTS}, {ENTRIES}")
    proc = subprocess.Popen(
        [sys.executable, "-c", child, d, str(n), stage, str(at)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if kill_at_line is not None and line.strip() != "done" and int(line) >= kill_at_line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    return proc.returncode


def reference(d: str, msgs: list[tuple[int, int, list[str]]]) -> list[bytes]:
    ref = IndexService(d, SLOTS, ENTRIES)
    ref.load()
    build(ref, msgs)
    out = contents(ref)
    ref.close()
    return out


def reload_and_check(d: str) -> int:
    """Repair the newest file as load would, check every file, return what the repair cleaned."""
    names = sorted(x for x in os.listdir(d) if not x.endswith(".tmp"))
    newest = IndexFile.open(os.path.join(d, names[-1]), SLOTS, ENTRIES)
    cleaned = newest.repair_torn()
    newest.close()
    svc = IndexService(d, SLOTS, ENTRIES)
    svc.load()
    for f in svc.files:
        check_consistent(f.path, SLOTS, ENTRIES)
    svc.close()
    return cleaned


def test_writer_killed_at_random_moments_recovers_exactly(tmp_path: Path) -> None:
    msgs = crash_messages(3000)
    expected = reference(str(tmp_path / "ref"), msgs)
    d = str(tmp_path / "crashed")
    rng = random.Random(7)
    kills = 0
    for round_no in range(5):
        line = round_no * 500 + rng.randrange(500)
        kills += run_child(d, len(msgs), "none", 0, line) == -signal.SIGKILL
        reload_and_check(d)
    assert kills >= 3  # only worth something if writers really died mid-run
    svc = IndexService(d, SLOTS, ENTRIES)
    svc.load()
    build(svc, msgs)
    assert contents(svc) == expected
    svc.close()


@pytest.mark.parametrize("stage", ["entry", "slot", "header_body"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_writer_killed_inside_a_put_recovers_exactly(tmp_path: Path, stage: str, seed: int) -> None:
    msgs = crash_messages(400)
    expected = reference(str(tmp_path / "ref"), msgs)
    d = str(tmp_path / "crashed")
    at = random.Random(seed).randrange(1, 3 * len(msgs))
    assert run_child(d, len(msgs), stage, at, None) == -signal.SIGKILL
    # The header is written once per message, so the repair undoes the keys of the message
    # that was in flight (each has three).
    assert 1 <= reload_and_check(d) <= 3
    svc = IndexService(d, SLOTS, ENTRIES)
    svc.load()
    build(svc, msgs)
    assert contents(svc) == expected
    svc.close()


@pytest.mark.parametrize("cut", [5, 101, 250])  # never where a file starts: 3 * cut % 49 != 0
def test_writer_killed_inside_a_trim_recovers_exactly(tmp_path: Path, cut: int) -> None:
    msgs = crash_messages(300)
    expected = reference(str(tmp_path / "ref"), msgs)
    trimmed = reference(str(tmp_path / "trimmed"), msgs[:cut])
    d = str(tmp_path / "crashed")
    assert run_child(d, len(msgs), "trim", cut, None) == -signal.SIGKILL
    assert reload_and_check(d) >= 1
    svc = IndexService(d, SLOTS, ENTRIES)
    svc.load()
    assert contents(svc) == trimmed
    build(svc, msgs)
    assert contents(svc) == expected
    svc.close()
