"""The on-disk timer wheel: what it pops and when, against a plain sorted model, and that pending
timers live in its file, not in the heap."""

import os
import random
import tracemalloc
from pathlib import Path

import pytest

from tidemq.services.broker.timer.wheel import ENTRY_BYTES, LOG_NAME, TimerWheel

pytestmark = pytest.mark.store

T0 = 1_700_000_000_000


def test_pops_match_a_sorted_model_in_due_seq_order_each_once(tmp_path: Path) -> None:
    rnd = random.Random(20)
    wheel = TimerWheel(str(tmp_path), slot_ms=100, slots=16)  # a 1.6 s turn
    model: set[tuple[int, int, int]] = set()
    popped: list[tuple[int, int, int]] = []
    seq = 0
    now = T0
    for _ in range(400):
        for _ in range(rnd.randrange(0, 30)):
            # Past, this window, later this turn, and several turns ahead.
            due = now + rnd.choice([-500, 0, 1, 37, 150, 900, 1600, 5000, rnd.randrange(20_000)])
            t = (due, seq, 1000 + seq * 64)
            seq += 1
            wheel.add(*t)
            model.add(t)
        assert wheel.next_due_ms() == min(model, default=(None,))[0]
        assert wheel.low_seq() == min((s for _, s, _ in model), default=None)
        now += rnd.choice([0, 1, 40, 99, 100, 250, 3000])
        limit = rnd.choice([1, 5, 1000])
        got = wheel.pop_due(now, limit)
        want = sorted(t for t in model if t[0] <= now)[:limit]
        assert got == want
        model.difference_update(got)
        popped += got
        assert wheel.pending_count == len(model)
    got = wheel.pop_due(now + 10**6, 10**6)
    assert got == sorted(model)
    assert len(popped) + len(got) == seq and wheel.pending_count == 0


def test_a_timer_a_turn_or_more_ahead_comes_back_at_its_time_not_before(tmp_path: Path) -> None:
    wheel = TimerWheel(str(tmp_path), slot_ms=1000, slots=10)  # a 10 s turn
    wheel.add(T0 + 35_500, 0, 7)  # same slot as T0 + 5_500, three turns later
    wheel.add(T0 + 5_500, 1, 8)
    assert wheel.pop_due(T0, 10) == []
    assert wheel.pop_due(T0 + 5_499, 10) == []
    assert wheel.pop_due(T0 + 5_500, 10) == [(T0 + 5_500, 1, 8)]
    for t in range(T0 + 6_000, T0 + 35_500, 700):
        assert wheel.pop_due(t, 10) == []
    assert wheel.next_due_ms() == T0 + 35_500
    assert wheel.pop_due(T0 + 35_500, 10) == [(T0 + 35_500, 0, 7)]
    assert wheel.next_due_ms() is None and wheel.low_seq() is None


def test_a_batch_cut_within_one_millisecond_continues_with_the_rest(tmp_path: Path) -> None:
    wheel = TimerWheel(str(tmp_path), slot_ms=1000, slots=60)
    for seq in range(10):
        wheel.add(T0, seq, seq)
    assert [s for _, s, _ in wheel.pop_due(T0, 4)] == [0, 1, 2, 3]
    assert wheel.low_seq() == 4
    assert [s for _, s, _ in wheel.pop_due(T0, 100)] == [4, 5, 6, 7, 8, 9]


def test_a_rebuild_after_clear_fires_the_overdue_first(tmp_path: Path) -> None:
    wheel = TimerWheel(str(tmp_path), slot_ms=1000, slots=60)
    wheel.add(T0 + 1000, 0, 0)
    wheel.pop_due(T0, 10)
    wheel.clear()
    assert wheel.pending_count == 0 and wheel.pop_due(T0 + 10**7, 10) == []
    # A broker back after two days: what it rebuilds is long overdue, or due later.
    for seq, due in enumerate([T0 - 2 * 86_400_000, T0 + 3000, T0 - 5, T0 - 86_400_000]):
        wheel.add(due, seq, seq)
    assert [s for _, s, _ in wheel.pop_due(T0, 10)] == [0, 3, 2]
    assert wheel.pop_due(T0 + 3000, 10) == [(T0 + 3000, 1, 1)]


def test_fired_entries_give_their_space_back(tmp_path: Path) -> None:
    log = tmp_path / LOG_NAME
    wheel = TimerWheel(str(tmp_path), slot_ms=10, slots=100)
    n = 70_000
    for seq in range(n):
        wheel.add(T0 + seq % 1000, seq, seq)
    wheel.add(T0 + 10**6, n, n)  # one far ahead keeps the log from emptying
    assert log.stat().st_size >= (n - 4096) * ENTRY_BYTES
    for t in range(T0, T0 + 1000, 100):
        wheel.pop_due(t, n)
    wheel.pop_due(T0 + 1000, n)
    # Once most of a large log is fired entries, the live ones are copied to a new one.
    assert wheel.pending_count == 1
    assert wheel.log_entries < n // 4
    assert log.stat().st_size <= wheel.log_entries * ENTRY_BYTES
    wheel.compact()
    assert wheel.log_entries == 1 and log.stat().st_size == ENTRY_BYTES
    assert wheel.pop_due(T0 + 10**6, 10) == [(T0 + 10**6, n, n)]
    assert log.stat().st_size == 0  # nothing pending: the log is emptied


def test_pending_timers_do_not_grow_the_heap(tmp_path: Path) -> None:
    wheel = TimerWheel(str(tmp_path), slot_ms=1000, slots=3600)
    n = 100_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(n):
            wheel.add(T0 + 60_000 + seq * 17, seq, seq * 200)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 100k pending timers: a write buffer, not ~30 MB of tuples.
    assert grown < 1 << 20, grown
    assert os.path.getsize(tmp_path / LOG_NAME) >= (n - 4096) * ENTRY_BYTES
    assert wheel.pending_count == n
    got = wheel.pop_due(T0 + 60_000 + 17 * 999, 10_000)
    assert [s for _, s, _ in got] == list(range(1000))
