"""One IndexFile: its exact bytes (size arithmetic, golden layout), hash chains and time ranges,
trimming back to exact earlier bytes, and repair of puts and trims torn by a crash.

The directory of files is IndexService's (test_index_service.py); writers SIGKILLed while
indexing are test_index_crash.py's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.index_checks import T, check_consistent, keys_st
from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.index_file import IndexFile, index_file_size
from tidemq.storage.index_service import IndexService

pytestmark = pytest.mark.store

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
