"""Index writers SIGKILLed while indexing (at random moments, inside a put, inside a trim): the
repair at load and a replay of the messages give back exactly the bytes of an index that never
crashed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.store.index_checks import T, build, check_consistent, contents
from tidemq.storage.index_file import IndexFile
from tidemq.storage.index_service import IndexService

pytestmark = pytest.mark.store

REPO = Path(__file__).resolve().parents[2]


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
