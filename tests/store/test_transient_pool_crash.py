"""SIGKILL of a writer process using the transient store pool: every acknowledged put survives
(SYNC: committed and flushed; ASYNC: committed, so in the page cache) and recovery finds a clean
log, whatever was still only in a write buffer at the kill.

The writer (crash_writer.py ``--pool N``) runs with 4 KiB files, so kills land in commits, rolls
and buffer hand-overs; with one buffer every roll takes the miss path. How many kills:
``TIDEMQ_POOL_CRASH_KILLS`` (default 20 per case)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store.crash_harness import ForkServer
from tests.store.test_crash import Model, run_until_killed, verify
from tests.store.workload import start_store, store_config
from tidemq.storage import FlushMode
from tidemq.storage.check import check_store

pytestmark = pytest.mark.store

KILLS = int(os.environ.get("TIDEMQ_POOL_CRASH_KILLS", "20"))


@pytest.fixture
def fork_server(tmp_path: Path) -> Iterator[ForkServer]:
    server = ForkServer(tmp_path)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize(
    ("flush", "buffers", "seed"),
    [(FlushMode.SYNC, 2, 11), (FlushMode.ASYNC, 2, 12), (FlushMode.ASYNC, 1, 13)],
    ids=["sync-2-buffers", "async-2-buffers", "async-1-buffer"],
)
def test_acknowledged_puts_survive_sigkill_with_the_pool(
    tmp_path: Path, flush: FlushMode, buffers: int, seed: int, fork_server: ForkServer
) -> None:
    root = tmp_path / "store"
    rng = random.Random(seed)
    model = Model()
    for cycle in range(KILLS):
        w = fork_server.spawn(
            root,
            "--seed",
            str(rng.randrange(2**32)),
            "--flush",
            flush.value,
            "--prefix",
            f"p{cycle}-",
            "--pool",
            str(buffers),
            err_path=tmp_path / f"writer-{cycle}.err",
        )
        try:
            rec = w.recovered()
            assert (rec.abnormal, rec.cut_bytes) == (False, 0), f"cycle {cycle}: {rec}"
            crash = run_until_killed(w, rng)
        finally:
            w.close()
        model.acks += crash.acks
        # Reopened without the pool: what recovery finds is the files, never a buffer.
        s = start_store(store_config(root, flush))
        try:
            r = s.recovery
            assert r is not None and r.abnormal
            assert r.end_offset >= max(a.end for a in model.acks)
            verify(s, model, random.Random(cycle))
        finally:
            s.close()
        rep = check_store(str(root))
        assert rep.ok, f"cycle {cycle}: {rep.problems}"
        assert rep.clean_shutdown
    assert len(model.acks) >= KILLS
