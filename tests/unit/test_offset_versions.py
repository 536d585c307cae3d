"""The merge rule of committed offsets (``offsets.supersedes``), without brokers or clocks: a
later reset generation wins, then the higher offset; merging in any order, any number of times,
ends in the same table, and without a reset no broker's offset ever moves backwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.services.broker.offsets import (
    CommittedOffset,
    OffsetManager,
    OffsetVersion,
    supersedes,
)


@pytest.mark.parametrize(
    ("candidate", "current", "wins"),
    [
        (OffsetVersion(0, 5), None, True),  # nothing yet
        (OffsetVersion(0, 6), OffsetVersion(0, 5), True),  # a commit further on
        (OffsetVersion(0, 4), OffsetVersion(0, 5), False),  # a stale commit
        (OffsetVersion(0, 5), OffsetVersion(0, 5), False),  # the same: nothing to take
        (OffsetVersion(1, 0), OffsetVersion(0, 900), True),  # a reset back to 0
        (OffsetVersion(0, 900), OffsetVersion(1, 0), False),  # an older generation, however far
    ],
)
def test_a_later_generation_wins_then_the_higher_offset(
    candidate: OffsetVersion, current: OffsetVersion | None, wins: bool
) -> None:
    assert supersedes(candidate, current) is wins


# One queue's history on two brokers: commits on either, resets on either, syncs either way.
Op = tuple[str, int, int]  # (what, broker, offset)
ops = st.lists(
    st.tuples(
        st.sampled_from(["commit", "commit", "commit", "reset", "sync"]),
        st.integers(0, 1),
        st.integers(0, 50),
    ),
    max_size=40,
)


def _run(tmp: Path, history: list[Op]) -> tuple[list[OffsetManager], list[list[int | None]]]:
    brokers = [OffsetManager(str(tmp / "a")), OffsetManager(str(tmp / "b"))]
    seen: list[list[int | None]] = [[], []]
    for what, i, offset in history:
        me, other = brokers[i], brokers[1 - i]
        if what == "commit":
            me.commit("g", "t", 0, offset)
        elif what == "reset":
            me.commit("g", "t", 0, offset, reset=True)
        else:  # a sync: the caller's table to the other side, the other side's back
            other.merge(me.entries())
            me.merge(other.entries())
        for j in (0, 1):
            seen[j].append(brokers[j].query("g", "t", 0))
    return brokers, seen


@settings(max_examples=200, deadline=None)
@given(history=ops)
def test_without_resets_no_offset_moves_back_and_one_sync_makes_both_the_highest(
    tmp_path_factory: pytest.TempPathFactory, history: list[Op]
) -> None:
    history = [op for op in history if op[0] != "reset"]
    brokers, seen = _run(tmp_path_factory.mktemp("v"), history)
    for views in seen:
        known = [v for v in views if v is not None]
        assert known == sorted(known), f"an offset moved backwards: {views}"
    brokers[1].merge(brokers[0].entries())
    brokers[0].merge(brokers[1].entries())
    commits = [o for what, _, o in history if what == "commit"]
    want = max(commits) if commits else None
    assert [b.query("g", "t", 0) for b in brokers] == [want, want]


@settings(max_examples=200, deadline=None)
@given(history=ops, order=st.permutations([0, 1, 2]))
def test_merging_in_any_order_and_again_ends_in_the_same_table(
    tmp_path_factory: pytest.TempPathFactory, history: list[Op], order: list[int]
) -> None:
    brokers, _ = _run(tmp_path_factory.mktemp("v"), history)
    third = OffsetManager(str(tmp_path_factory.mktemp("c")))
    third.commit("g", "t", 0, 17)
    tables = [b.entries() for b in (*brokers, third)]

    def merged(sequence: list[int]) -> list[CommittedOffset]:
        m = OffsetManager(str(tmp_path_factory.mktemp("m")))
        for k in sequence:
            m.merge(tables[k])
            m.merge(tables[k])  # idempotent: twice is once
        return m.entries()

    assert merged(order) == merged([0, 1, 2])
