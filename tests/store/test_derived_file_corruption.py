"""Damaged files beside the CommitLog, through the driver in damaged_store.py: ConsumeQueues and
the index are derived data, so whatever is lost of them is rebuilt from the CommitLog; a lost or
garbled checkpoint after a kill makes recovery scan the whole log.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from tests.store.damaged_store import Expect, build, repair_case
from tests.store.workload import Ack, put_batches, start_store, store_config
from tidemq.storage import MessageStore
from tidemq.storage.check import check_store
from tidemq.storage.checkpoint import read_checkpoint
from tidemq.storage.recovery import RecoveryReport

pytestmark = pytest.mark.store


# ----------------------------------------------------------------------------- ConsumeQueues
@pytest.mark.parametrize(
    ("shutdown", "what"),
    [
        ("clean", "queue-dir"),
        ("clean", "consumequeue-dir"),
        ("clean", "last-queue-file"),
        ("kill", "queue-dir"),
        ("kill", "consumequeue-dir"),
        # Beyond the last file: recovery's promise ("if a ConsumeQueue turns out to miss entries
        # (files deleted), the whole log is re-dispatched") covers any lost file. A lost first
        # file must not pass for retention (OffsetBelowMinError while the CommitLog still holds
        # the messages), nor a lost middle one make the store refuse to open.
        ("clean", "first-queue-file"),
        ("clean", "middle-queue-file"),
    ],
)
def test_missing_consume_queue_files_are_rebuilt(tmp_path: Path, shutdown: str, what: str) -> None:
    """Queues are derived data: whatever is lost of them is rebuilt from the CommitLog."""

    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        sizes: dict[tuple[str, int], int] = {}
        for a in acks:
            sizes[a.topic, a.queue_id] = sizes.get((a.topic, a.queue_id), 0) + 1
        topic, qid = max(sizes, key=lambda k: sizes[k])
        qdir = root / "consumequeue" / topic / str(qid)
        qfiles = sorted(qdir.iterdir())
        if what == "queue-dir":
            shutil.rmtree(qdir)
        elif what == "consumequeue-dir":
            shutil.rmtree(root / "consumequeue")
        else:
            assert len(qfiles) >= 3
            lost = {"first-queue-file": 0, "middle-queue-file": 1, "last-queue-file": -1}[what]
            qfiles[lost].unlink()

        def check(s: MessageStore, r: RecoveryReport) -> None:
            assert r.full_redispatch
            assert r.cut_bytes == 0
            assert s.max_offset(topic, qid) == sizes[topic, qid]

        return Expect(acks, check=check)

    repair_case(tmp_path, shutdown, corrupt, seed=16)


# ----------------------------------------------------------------------------- checkpoint
@pytest.mark.parametrize("how", ["deleted", "garbled"])
def test_missing_checkpoint_after_kill_forces_a_full_scan(tmp_path: Path, how: str) -> None:
    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        cp = root / "checkpoint"
        if how == "deleted":
            cp.unlink()
        else:
            raw = bytearray(cp.read_bytes())
            raw[43] ^= 0xFF  # recovery offset: the CRC no longer matches
            cp.write_bytes(bytes(raw))
        assert read_checkpoint(str(root)) is None

        def check(s: MessageStore, r: RecoveryReport) -> None:
            assert not r.checkpoint_found
            assert r.scan_from == 0
            assert r.records_scanned == len(acks)
            assert r.cut_bytes == 0

        return Expect(acks, end=max(a.end for a in acks), check=check)

    repair_case(tmp_path, "kill", corrupt, seed=17)


# ----------------------------------------------------------------------------- index
def test_missing_index_is_rebuilt_by_a_full_scan(tmp_path: Path) -> None:
    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        shutil.rmtree(root / "index")
        (root / "checkpoint").unlink()
        return Expect(acks)  # verify_exactly looks every survivor up by key

    repair_case(tmp_path, "clean", corrupt, seed=18)


def test_missing_index_after_clean_shutdown_is_rebuilt(tmp_path: Path) -> None:
    """The manifest records how far the index reached; a shorter index after a restart (files
    lost) makes recovery re-dispatch the whole CommitLog, so every key is found again."""
    root = tmp_path / "store"
    acks = build(root, "clean", seed=19)
    shutil.rmtree(root / "index")
    s = start_store(store_config(root))
    try:
        assert s.recovery is not None
        assert s.recovery.full_redispatch
        for a in acks:
            assert s.look_message(a.phy_offset).keys == list(a.keys)
            assert [m.phy_offset for m in s.query_by_key(a.topic, a.key)] == [a.phy_offset]
        new = put_batches(s, random.Random(20), "after", 10)
        for a in new:
            assert [m.phy_offset for m in s.query_by_key(a.topic, a.key)] == [a.phy_offset]
    finally:
        s.close()
    assert check_store(str(root)).ok
