"""Crash tests: a real writer process (crash_writer.py) SIGKILLed at random moments, again and
again on the same store, and the promises a killed store must keep.

- Every acknowledged message survives: at its CommitLog offset, at its queue offset, by message
  id and by key, with the same body. SYNC acknowledges after the flush; ASYNC after the append to
  the mapping, which the page cache keeps across a SIGKILL, so both must survive a process crash.
- What recovery brings back is whole: queues run 0..n-1 without gaps, every record is one a
  writer produced byte for byte, nothing seen after one crash disappears after a later one, and
  the offline checker (library and CLI) finds nothing wrong.
- One process per store: the flock names its holder and dies with it.

How many kills (environment variables, read at collection):

- ``TIDEMQ_CRASH_KILLS`` (default 100): writer kills in all, three fifths of them with SYNC
  flush and the rest with ASYNC flush, each kill followed by a recovery that is checked;
- ``TIDEMQ_CRASH_SEED`` (default: fixed seeds): vary it to explore other kill moments
  (``TIDEMQ_CRASH_KILLS=1000 TIDEMQ_CRASH_SEED=$RANDOM pytest tests/store/test_crash.py`` is a
  soak of the store alone).

Each run prints (with ``-s``, and in pytest's closing summary) how many kills ran clean, the
seed and the wall time, and fails unless every kill did.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tests.store.crash_harness import ForkServer, Writer, WriterOutput, run_cli
from tests.store.store_checks import check_ack_lookups, check_queues_contiguous, read_all
from tests.store.workload import FILE_SIZE, Ack, assert_matches, ident, start_store, store_config
from tidemq.storage import FlushMode, MessageStore
from tidemq.storage.check import check_store
from tidemq.storage.errors import StoreLockedError

pytestmark = pytest.mark.store

KILLS = int(os.environ.get("TIDEMQ_CRASH_KILLS", "100"))
SYNC_KILLS = -(-KILLS * 3 // 5)
ASYNC_KILLS = KILLS - SYNC_KILLS
_SEED = os.environ.get("TIDEMQ_CRASH_SEED")
SYNC_SEED = 20240611 if _SEED is None else int(_SEED)
ASYNC_SEED = 7 if _SEED is None else int(_SEED) + 1


@dataclass
class Model:
    """What the parent knows: every acknowledged message, and the whole store as last seen."""

    acks: list[Ack] = field(default_factory=list)
    looked_up: int = 0  # acks[:looked_up] went through every lookup once already
    known: dict[tuple[str, int], list[tuple[int, int, tuple[str, ...], str]]] = field(
        default_factory=dict
    )


def verify(s: MessageStore, model: Model, rng: random.Random) -> int:
    """Check the reopened store against the model, then make what it holds the new model.
    Returns the number of messages in the store."""
    queues = read_all(s)
    check_queues_contiguous(s, queues)
    # Nothing recovered before (acknowledged or not) may change or vanish after a later crash.
    for key, before in model.known.items():
        now = [ident(m) for m in queues.get(key, [])[: len(before)]]
        assert now == before, f"{key}: a later recovery changed what an earlier one kept"
    for a in model.acks:
        msgs = queues.get((a.topic, a.queue_id), [])
        assert a.queue_offset < len(msgs), f"acknowledged {a} lost (queue holds {len(msgs)})"
        assert_matches(msgs[a.queue_offset], a)
        assert_matches(s.look_message(a.phy_offset), a)
        assert_matches(s.get_message_by_id(a.msg_id), a)
    # By key (each query walks every index file): the new ones and a sample of the rest.
    fresh = model.acks[model.looked_up :]
    older = rng.sample(model.acks[: model.looked_up], min(20, model.looked_up))
    for a in fresh + older:
        check_ack_lookups(s, a)
    model.looked_up = len(model.acks)
    model.known = {k: [ident(m) for m in v] for k, v in queues.items()}
    return sum(len(v) for v in queues.values())


@dataclass
class Crash:
    """How one writer died, and what its recovery must therefore report."""

    mode: str
    acks: list[Ack]
    torn_at: int | None = None  # torn-record: offset of the half-written record
    torn_nonzero: bool = False  # ... and whether any of its bytes reached the file non-zero
    blank: bool = False  # after-blank: killed with a blank marker as the last thing written

    def check(self, abnormal: bool, cut_bytes: int, end_offset: int) -> None:
        assert abnormal, f"{self.mode}: a killed store must recover as abnormal"
        if self.acks:
            # The cut (and its evidence) starts past the last acknowledged byte.
            assert end_offset >= max(a.end for a in self.acks)
        if self.torn_at is not None:
            assert end_offset == self.torn_at, f"torn record at {self.torn_at}, end {end_offset}"
            assert (cut_bytes > 0) == self.torn_nonzero, cut_bytes
        if self.blank:
            assert end_offset % FILE_SIZE == 0, end_offset


def run_until_killed(w: WriterOutput, rng: random.Random) -> Crash:
    """Read the writer's lines until a random number of acknowledgements arrived, SIGKILL it at
    a randomly chosen kind of moment, and return every acknowledgement it printed."""
    target = rng.randint(1, 30)
    style = rng.choice(["at-ack", "at-batch-start", "after-more-lines"])
    more = rng.randint(1, 8)
    acks: list[Ack] = []
    while True:
        line = w.readline()
        if line.startswith("A"):
            acks.append(Ack.parse(line))
        else:
            assert line.startswith("B"), f"unexpected line {line!r}:\n{w.stderr()}"
        if len(acks) < target:
            continue
        if style == "at-ack" and line.startswith("A"):
            break  # the writer is just past a flush, preparing or printing the next batch
        if style == "at-batch-start" and line.startswith("B"):
            break  # the writer is inside put_messages: writing records, rolling, flushing
        if style == "after-more-lines":
            more -= 1
            if more < 0:
                break
    # Lines already in the pipe were printed after PUT_OK too: they count as acknowledged.
    acks += [Ack.parse(x) for x in w.kill() if x.startswith("A")]
    return Crash(style, acks)


def run_until_failpoint(w: WriterOutput, mode: str) -> Crash:
    """Read every line of a writer that SIGKILLs itself inside a CommitLog write."""
    crash = Crash(mode, [])
    for line in w.reader.lines(60):
        if line.startswith("A"):
            crash.acks.append(Ack.parse(line))
        elif line.startswith("K torn"):
            _, _, at, _k, nonzero = line.split()
            crash.torn_at, crash.torn_nonzero = int(at), nonzero == "1"
        elif line.startswith("K blank"):
            crash.blank = True
    assert w.kill() == []
    assert crash.torn_at is not None or crash.blank, f"failpoint never hit:\n{w.stderr()}"
    return crash


@pytest.fixture
def fork_server(tmp_path: Path) -> Iterator[ForkServer]:
    server = ForkServer(tmp_path)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize(
    ("flush", "seed", "cycles"),
    [(FlushMode.SYNC, SYNC_SEED, SYNC_KILLS), (FlushMode.ASYNC, ASYNC_SEED, ASYNC_KILLS)],
    ids=["sync", "async"],
)
def test_acknowledged_messages_survive_repeated_sigkill(
    tmp_path: Path,
    flush: FlushMode,
    seed: int,
    cycles: int,
    report_summary: Callable[[str], None],
    fork_server: ForkServer,
) -> None:
    if cycles < 2:
        pytest.skip(f"TIDEMQ_CRASH_KILLS={KILLS} leaves {cycles} {flush.value} kills")
    started = time.monotonic()
    root = tmp_path / "store"
    cfg = store_config(root, flush)
    rng = random.Random(seed)
    model = Model()
    pending: Crash | None = None  # a crash the next writer recovers itself
    total = 0
    modes: list[str] = []
    cuts = 0
    unchecked = 0  # kills whose recovery was not checked yet (crash on crash)
    clean = 0  # kills whose recovery was checked and kept every promise
    for cycle in range(cycles):
        # Mostly SIGKILL from here at a random moment; sometimes a kill from inside a CommitLog
        # write (a torn record, a blank marker with the batch's rest unwritten), since a kill
        # from outside lands there only by rare luck.
        mode = rng.choice(["kill", "kill", "kill", "torn-record", "after-blank"])
        args = [
            "--seed",
            str(rng.randrange(2**32)),
            "--flush",
            flush.value,
            "--prefix",
            f"c{cycle}-",
            "--checkpoint-ms",
            str(rng.choice([10, 50, 200, 1000])),
        ]
        if mode != "kill":
            after = rng.randint(0, 40) if mode == "torn-record" else rng.randint(0, 3)
            args += ["--failpoint", mode, "--failpoint-after", str(after)]
        w = fork_server.spawn(root, *args, err_path=tmp_path / f"writer-{cycle}.err")
        try:
            rec = w.recovered()
            if pending is not None:
                pending.check(rec.abnormal, rec.cut_bytes, rec.end_offset)
                cuts += rec.cut_bytes > 0
            else:
                # After our clean close: nothing to repair.
                assert (rec.abnormal, rec.cut_bytes) == (False, 0), f"cycle {cycle}: {rec}"
            crash = run_until_killed(w, rng) if mode == "kill" else run_until_failpoint(w, mode)
        finally:
            w.close()
        model.acks += crash.acks
        modes.append(crash.mode)
        unchecked += 1
        # The whole acknowledged history, not just this writer's, is past any cut.
        crash.acks = list(model.acks)

        if cycle < cycles - 1 and rng.random() < 0.25:
            # Crash on crash: the next writer recovers this one's mess itself and carries on;
            # its acknowledgements and these are all checked at the next verification.
            pending = crash
            continue
        pending = None
        # Every other recovery rebuilds the index in its helper process (storage.index_rebuild),
        # which must leave exactly what the store's own dispatch leaves. A kill right after a
        # checkpoint can leave nothing to re-dispatch, and then there is nothing to hand over.
        helper = cycle % 2 == 1
        s = start_store(replace(cfg, recovery_index_helper_min_bytes=0 if helper else None))
        try:
            r = s.recovery
            assert r is not None
            expect_helper = helper and r.records_redispatched > 0
            assert (r.index_helper, r.index_helper_failure) == (expect_helper, None)
            crash.check(r.abnormal, r.cut_bytes, r.end_offset)
            cuts += r.cut_bytes > 0
            notes = [json.loads(Path(b).with_suffix(".json").read_text()) for b in r.evidence_files]
            assert all(n["offset"] >= r.end_offset for n in notes)
            assert sum(n["length"] for n in notes) == r.cut_bytes
            total = verify(s, model, random.Random(cycle))
        finally:
            s.close()
        rep = check_store(str(root))
        assert rep.ok, f"cycle {cycle}: {rep.problems}"
        assert rep.clean_shutdown
        assert rep.records == total
        clean, unchecked = clean + unchecked, 0

    report_summary(
        f"crash test ({flush.value} flush, seed {seed}): {clean} of {cycles} writer kills ran "
        f"clean, {len(model.acks)} acknowledged messages kept, "
        f"{time.monotonic() - started:.1f} s"
    )
    assert clean == cycles, f"{cycles - clean} kills were never checked"

    # Only worth something if writers really died in every way, with work acknowledged.
    assert len(model.acks) >= cycles
    assert {"torn-record", "after-blank"} <= set(modes), modes
    assert cuts >= 1
    cli = run_cli("store", "check", str(root), "--json")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    report = json.loads(cli.stdout)
    assert report["ok"]
    assert report["records"] == total


@pytest.mark.skipif(
    "TIDEMQ_CRASH_KILLS" in os.environ,
    reason="TIDEMQ_CRASH_KILLS overrides the default count this checks",
)
def test_make_test_drives_at_least_100_writer_kills() -> None:
    assert (SYNC_KILLS, ASYNC_KILLS) == (60, 40)


def test_store_lock_refuses_a_second_process_until_the_holder_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    cfg = store_config(root)
    holder = Writer(root, "--count", "7", "--hold", err_path=tmp_path / "holder.err")
    try:
        assert holder.recovered().pid == holder.pid
        acks = []
        while (line := holder.readline()) != "D":
            if line.startswith("A"):
                acks.append(Ack.parse(line))
        assert len(acks) == 7

        # Another writer process is refused, and the refusal names the holder.
        second = Writer(root, "--count", "1", err_path=tmp_path / "second.err")
        refusal = second.readline()
        assert second.finish() == 4, second.stderr()
        assert refusal.startswith("L StoreLockedError"), refusal
        assert f"pid {holder.pid}" in refusal

        # So are the offline checker and an open in this process.
        cli = run_cli("store", "check", str(root))
        assert cli.returncode == 2
        assert "STORE_LOCKED" in cli.stderr
        assert f"pid {holder.pid}" in cli.stderr
        with pytest.raises(StoreLockedError, match=f"pid {holder.pid}"):
            MessageStore(cfg).open()

        # The kernel drops the flock with the process: no stale lock after SIGKILL.
        assert holder.kill() == []
    finally:
        holder.close()
    s = start_store(cfg)
    try:
        assert s.recovery is not None
        assert s.recovery.abnormal
        for a in acks:
            check_ack_lookups(s, a)
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
            MessageStore(cfg).open()
    finally:
        s.close()
    assert check_store(str(root)).ok
