"""Shared by the IndexFile, IndexService and killed-writer tests: the clock they index at, the
offline check of one file's raw bytes, and building and reading back an IndexService."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from tidemq.storage.index_service import IndexService

T = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z


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


def build(svc: IndexService, msgs: list[tuple[int, int, list[str]]]) -> None:
    for phy, ts, keys in msgs:
        svc.build_index("orders", phy, ts, keys)


keys_st = st.lists(st.sampled_from(["a", "b", "c", "Aa", "BB", "hello", "world", "q"]), max_size=3)
