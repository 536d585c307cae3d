"""The driver of the damaged-store tests (etcd's repair_test): build a store with tiny files
(closed cleanly, or its writer SIGKILLed), let a ``corrupt`` function damage it and say what must
survive, reopen (recovery), then check that exactly the survivors are readable every way, that
appends continue at the right CommitLog and queue offsets, that the offline checker is happy and
that a second, clean reopen changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.store.crash_harness import Writer
from tests.store.store_checks import verify_exactly
from tests.store.workload import FILE_SIZE, Ack, put_batches, start_store, store_config
from tidemq.storage import FlushMode, MessageStore
from tidemq.storage.check import check_store
from tidemq.storage.recovery import RecoveryReport

COUNT = 120  # messages: with bodies up to 600 bytes, 10-20 CommitLog files; the biggest queue
# spans at least 3 ConsumeQueue files of 16 entries


# ----------------------------------------------------------------------------- building stores
def build_clean(root: Path, seed: int, flush: FlushMode = FlushMode.SYNC) -> list[Ack]:
    s = start_store(store_config(root, flush))
    try:
        return put_batches(s, random.Random(seed), "m", COUNT)
    finally:
        s.close()


def build_killed(root: Path, seed: int, flush: FlushMode = FlushMode.SYNC) -> list[Ack]:
    """A writer process appends COUNT messages (closing and reopening halfway, so the checkpoint
    stands at that point: no periodic checkpoints) and is SIGKILLed holding the store open."""
    w = Writer(
        root,
        "--seed",
        str(seed),
        "--flush",
        flush.value,
        "--count",
        str(COUNT),
        "--hold",
        "--checkpoint-ms",
        "3600000",
        "--reopen-after",
        str(COUNT // 2),
        err_path=root.parent / "writer.err",
    )
    acks: list[Ack] = []
    try:
        w.recovered()
        while (line := w.readline()) != "D":
            if line.startswith("A"):
                acks.append(Ack.parse(line))
        assert w.kill() == []
    finally:
        w.close()
    assert len(acks) == COUNT
    assert (root / "abort").exists()
    return acks


def build(root: Path, shutdown: str, seed: int, flush: FlushMode = FlushMode.SYNC) -> list[Ack]:
    root.parent.mkdir(parents=True, exist_ok=True)
    return (build_clean if shutdown == "clean" else build_killed)(root, seed, flush)


# ----------------------------------------------------------------------------- the driver
@dataclass
class Expect:
    """What recovery must make of the damage."""

    survivors: list[Ack]
    end: int | None = None  # where the CommitLog must end after recovery
    check: Callable[[MessageStore, RecoveryReport], None] | None = None  # case-specific
    config: dict[str, object] = field(default_factory=dict)


Corrupt = Callable[[Path, list[Ack]], Expect]


def reopen_and_check(
    root: Path, exp: Expect, abnormal: bool, rng: random.Random, flush: FlushMode
) -> None:
    cfg = store_config(root, flush, **exp.config)
    s = start_store(cfg)
    try:
        r = s.recovery
        assert r is not None
        assert r.abnormal is abnormal
        if exp.end is not None:
            assert r.end_offset == exp.end, f"the log must end at {exp.end} now: {r}"
            assert s.commitlog.max_offset == exp.end
        verify_exactly(s, exp.survivors)
        if exp.check is not None:
            exp.check(s, r)
        appended = append_more(s, rng, r.end_offset, exp.survivors)
    finally:
        s.close()
    rep = check_store(str(root))
    assert rep.ok, rep.problems
    assert rep.records == len(exp.survivors) + len(appended)
    # A clean reopen finds nothing more to do and the same contents.
    s = start_store(cfg)
    try:
        assert s.recovery is not None
        assert not s.recovery.abnormal
        assert s.recovery.cut_bytes == 0
        assert not s.recovery.full_redispatch
        verify_exactly(s, exp.survivors + appended)
    finally:
        s.close()


def append_more(s: MessageStore, rng: random.Random, end: int, before: list[Ack]) -> list[Ack]:
    """New appends start where the log now ends and continue every queue without a gap."""
    more = put_batches(s, rng, "after", 15)
    first = more[0].phy_offset
    assert first in (end, end - end % FILE_SIZE + FILE_SIZE), (first, end)
    counts: dict[tuple[str, int], int] = {}
    for a in before:
        counts[a.topic, a.queue_id] = counts.get((a.topic, a.queue_id), 0) + 1
    for a in more:
        key = (a.topic, a.queue_id)
        assert a.queue_offset == counts.get(key, 0), f"{a} after {counts.get(key, 0)} survivors"
        counts[key] = a.queue_offset + 1
    verify_exactly(s, before + more)
    return more


def repair_case(
    tmp_path: Path,
    shutdown: str,
    corrupt: Corrupt,
    seed: int = 1,
    flush: FlushMode = FlushMode.SYNC,
) -> None:
    root = tmp_path / "store"
    acks = build(root, shutdown, seed, flush)
    exp = corrupt(root, acks)
    reopen_and_check(root, exp, shutdown == "kill", random.Random(seed + 1), flush)
