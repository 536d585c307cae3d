"""Damaged CommitLogs, through the driver in damaged_store.py: a torn last record is cut and kept
as evidence, zero-filled tails (a clean shutdown's, a power cut's) are cut without any, a flipped
bit in a middle file is found by the checker and refused by every read (and cut, with evidence,
when truncate_on_corruption allows), a kill in the middle of a cut loses no cut byte; and reads
never call a good record that is still being dispatched corrupt.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.store.crash_harness import Writer
from tests.store.damaged_store import Expect, build, reopen_and_check, repair_case
from tests.store.raw_log import (
    BODY_AT,
    commitlog_files,
    evidence,
    flip_bit,
    read_log,
    snapshot_log,
    zero_log,
)
from tests.store.workload import FILE_SIZE, Ack, assert_matches, start_store, store_config
from tidemq.storage import FlushMode, Message, MessageStore, PutStatus
from tidemq.storage.check import check_store
from tidemq.storage.checkpoint import read_checkpoint
from tidemq.storage.errors import (
    CorruptRecordError,
    CorruptStoreError,
    MessageNotFoundError,
    StoreError,
)
from tidemq.storage.recovery import RecoveryReport

pytestmark = pytest.mark.store


# ----------------------------------------------------------------------------- helpers
def last_file_base(root: Path) -> int:
    return int(commitlog_files(root)[-1].name)


def file_base(offset: int) -> int:
    return offset - offset % FILE_SIZE


def assert_zero_from(root: Path, offset: int) -> None:
    pos = offset % FILE_SIZE
    assert read_log(root, offset, FILE_SIZE - pos) == bytes(FILE_SIZE - pos)


def assert_gone(s: MessageStore, a: Ack) -> None:
    with pytest.raises(MessageNotFoundError):
        s.look_message(a.phy_offset)
    assert s.query_by_key(a.topic, a.key) == []


# ----------------------------------------------------------------------------- torn last record
@pytest.mark.parametrize("shutdown", ["clean", "kill"])
@pytest.mark.parametrize(
    "style",
    [
        "second-half-zeroed",
        "header-only",
        # Header, body and topic made it, the end of the properties did not: BODYCRC covers the
        # body only, so only the whole-record CRC (config.record_crc) can tell.
        "properties-tail-zeroed",
    ],
)
def test_torn_last_record_is_cut_and_kept_as_evidence(
    tmp_path: Path, shutdown: str, style: str
) -> None:
    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        last = max(acks, key=lambda a: a.phy_offset)
        keep = {
            "second-half-zeroed": last.size // 2,
            "header-only": BODY_AT,
            "properties-tail-zeroed": last.size - 3,
        }[style]
        zero_log(root, last.phy_offset + keep, last.size - keep)
        torn = read_log(root, last.phy_offset, last.size).rstrip(b"\0")
        assert torn
        queue_len = sum(1 for a in acks if (a.topic, a.queue_id) == (last.topic, last.queue_id))
        assert last.queue_offset == queue_len - 1

        def check(s: MessageStore, r: RecoveryReport) -> None:
            assert r.cut_bytes == len(torn)
            assert r.cut_reason is not None
            assert len(r.evidence_files) == 1
            ((note, saved, _),) = evidence(root)
            assert note["offset"] == last.phy_offset
            assert Path(r.evidence_files[0]).read_bytes() == saved == torn
            assert note["length"] == len(torn)
            assert note["kind"] == "commitlog"
            assert_zero_from(root, last.phy_offset)
            # The queue no longer points at the cut record: one entry shorter.
            assert s.max_offset(last.topic, last.queue_id) == queue_len - 1
            assert s.get_messages(last.topic, last.queue_id, queue_len - 1).messages == []
            assert_gone(s, last)

        return Expect([a for a in acks if a is not last], end=last.phy_offset, check=check)

    repair_case(tmp_path, shutdown, corrupt, seed=11)


# ----------------------------------------------------------------------------- zero-filled tail
@pytest.mark.parametrize("style", ["last-3-records", "whole-last-file"])
def test_zero_filled_tail_after_clean_shutdown(tmp_path: Path, style: str) -> None:
    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        base = last_file_base(root)
        in_last = [a for a in acks if a.phy_offset >= base]
        n = len(in_last) if style == "whole-last-file" else min(3, len(in_last) - 1)
        assert n >= 1
        gone = in_last[-n:]
        zero_log(root, gone[0].phy_offset, gone[-1].end - gone[0].phy_offset)

        def check(s: MessageStore, r: RecoveryReport) -> None:
            assert r.cut_bytes == 0  # zeros are no evidence
            assert r.evidence_files == []
            assert not (root / "evidence").exists()
            for a in gone:
                assert_gone(s, a)
            if style == "whole-last-file":
                assert int(commitlog_files(root)[-1].name) == base - FILE_SIZE

        return Expect(acks[:-n], end=gone[0].phy_offset, check=check)

    repair_case(tmp_path, "clean", corrupt, seed=12)


def test_zero_filled_tail_across_files_after_power_loss(tmp_path: Path) -> None:
    """ASYNC flush, writer killed, then everything from some record past the checkpoint on
    (blank markers and whole files included) reads as zeros: what a power cut leaves of pages
    that were never flushed."""

    def corrupt(root: Path, acks: list[Ack]) -> Expect:
        cp = read_checkpoint(str(root))
        assert cp is not None
        last_base = last_file_base(root)
        # A record past the checkpoint, in an earlier file than the last and not its first: the
        # zeros then run from inside one file through its blank marker and the files after it.
        candidates = [
            a
            for a in acks
            if cp.recovery_offset <= a.phy_offset < last_base and a.phy_offset % FILE_SIZE
        ]
        assert candidates, "the second half of the build should span several files"
        cut = random.Random(13).choice(candidates).phy_offset
        zero_log(root, cut, last_base + FILE_SIZE - cut)

        def check(s: MessageStore, r: RecoveryReport) -> None:
            assert r.cut_bytes == 0
            assert [int(p.name) for p in commitlog_files(root)][-1] == file_base(cut)
            assert_zero_from(root, cut)
            for a in acks:
                if a.phy_offset >= cut:
                    assert_gone(s, a)

        return Expect([a for a in acks if a.phy_offset < cut], end=cut, check=check)

    repair_case(tmp_path, "kill", corrupt, seed=13, flush=FlushMode.ASYNC)


# ----------------------------------------------------------------------------- mid-log bit flip
@pytest.mark.parametrize("where", ["body", "magic", "size"])
def test_bit_flip_in_a_middle_file(tmp_path: Path, where: str) -> None:
    root = tmp_path / "store"
    acks = build(root, "clean", seed=14)
    rng = random.Random(f"flip-{where}")
    files = commitlog_files(root)
    assert len(files) >= 5
    middle = int(files[len(files) // 2].name)
    victim = rng.choice([a for a in acks if file_base(a.phy_offset) == middle])
    x = victim.phy_offset
    if where == "body":
        flip_bit(root, x + BODY_AT + rng.randrange(victim.body_len), rng.randrange(8))
    elif where == "magic":
        flip_bit(root, x + 5, 2)
    else:
        flip_bit(root, x + 2, 3)  # TOTALSIZE + 2048
    assert (root / "checkpoint").exists()
    assert not (root / "abort").exists()

    # 1. The offline checker finds it and names the offset.
    rep = check_store(str(root))
    assert not rep.ok
    assert any(p.startswith(f"CommitLog offset {x}:") for p in rep.problems), rep.problems

    # 2. A clean shutdown's recovery only re-reads the newest file: the store opens, but the
    #    record is refused on every read path instead of returning garbage.
    s = start_store(store_config(root))
    try:
        assert s.recovery is not None
        assert s.recovery.cut_bytes == 0
        with pytest.raises(CorruptRecordError) as e:
            s.look_message(x)
        assert e.value.offset == x
        with pytest.raises(CorruptRecordError) as e:
            s.get_messages(victim.topic, victim.queue_id, victim.queue_offset, 1)
        assert e.value.offset == x
        with pytest.raises(MessageNotFoundError):
            s.get_message_by_id(victim.msg_id)
        assert s.query_by_key(victim.topic, victim.key) == []
        for a in acks:
            if a is not victim:
                assert_matches(s.look_message(a.phy_offset), a)
    finally:
        s.close()

    # 3. Without a checkpoint recovery scans everything, and a bad record with valid ones after
    #    it is corruption, not a torn tail: the store refuses to open and cuts nothing.
    os.unlink(root / "checkpoint")
    before = snapshot_log(root)
    with pytest.raises(CorruptStoreError, match=f"at offset {x} "):
        start_store(store_config(root))
    assert snapshot_log(root) == before
    assert not (root / "evidence").exists()

    # 4. truncate_on_corruption cuts there; every removed byte is kept under evidence/.
    def check(s: MessageStore, r: RecoveryReport) -> None:
        assert r.cut_reason is not None
        assert str(x) in r.cut_reason
        saved = evidence(root)
        assert sorted(str(p) for _, _, p in saved) == sorted(r.evidence_files)
        assert sum(len(b) for _, b, _ in saved) == r.cut_bytes > 0
        covered: set[int] = set()
        for note, data, _ in saved:
            at = note["offset"]
            assert note["length"] == len(data)
            assert before[file_base(at)][at % FILE_SIZE : at % FILE_SIZE + len(data)] == data
            covered |= set(range(at, at + len(data)))
        removed = {
            base + i
            for base, raw in before.items()
            for i, byte in enumerate(raw)
            if byte and base + i >= x
        }
        assert removed <= covered, "non-zero bytes were cut without evidence"
        # ... and nothing else: per file, from the cut to its last non-zero byte.
        extent = sum(
            len(raw[max(x - base, 0) :].rstrip(b"\0"))
            for base, raw in before.items()
            if base + FILE_SIZE > x
        )
        assert r.cut_bytes == extent
        assert [int(p.name) for p in commitlog_files(root)][-1] == middle
        assert_zero_from(root, x)
        for a in acks:
            if a.phy_offset >= x:
                assert_gone(s, a)

    exp = Expect(
        [a for a in acks if a.phy_offset < x],
        end=x,
        check=check,
        config={"truncate_on_corruption": True},
    )
    reopen_and_check(root, exp, False, random.Random(15), FlushMode.SYNC)


# ----------------------------------------------------------------------------- kill during a cut
def test_kill_while_cutting_loses_no_cut_bytes(tmp_path: Path) -> None:
    """Recovery with truncate_on_corruption promises that what it cuts is kept under evidence/.
    A writer SIGKILLed the moment recovery hands the first cut bytes to the evidence writer
    must therefore leave every acknowledged record past the corruption either still in the
    CommitLog or saved as evidence."""
    root = tmp_path / "store"
    acks = build(root, "clean", seed=21)
    files = commitlog_files(root)
    middle = int(files[len(files) // 2].name)
    in_middle = [a for a in acks if file_base(a.phy_offset) == middle]
    assert len(in_middle) >= 2
    victim = in_middle[0]
    flip_bit(root, victim.phy_offset + BODY_AT, 0)
    (root / "checkpoint").unlink()
    before = snapshot_log(root)

    w = Writer(
        root,
        "--count",
        "0",
        "--truncate-on-corruption",
        "--failpoint",
        "evidence-kill",
        err_path=tmp_path / "writer.err",
    )
    try:
        lines = list(w.reader.lines(60))
        assert w.kill() == []
    finally:
        w.close()
    assert lines, "the writer printed nothing"
    assert lines[-1].startswith(f"K evidence {victim.phy_offset} "), lines

    now = snapshot_log(root)
    saved = evidence(root)
    lost = []
    for a in acks:
        if a.phy_offset <= victim.phy_offset:
            continue
        pos = a.phy_offset % FILE_SIZE
        original = before[file_base(a.phy_offset)][pos : pos + a.size]
        in_log = now.get(file_base(a.phy_offset), b"")[pos : pos + a.size] == original
        in_evidence = any(
            b[a.phy_offset - n["offset"] : a.end - n["offset"]] == original
            for n, b, _ in saved
            if n["offset"] <= a.phy_offset
        )
        if not (in_log or in_evidence):
            lost.append(a.phy_offset)
    assert not lost, (
        f"killed while cutting at {victim.phy_offset}: acknowledged records at {lost} are "
        f"neither in the CommitLog nor under evidence/"
    )


# ----------------------------------------------------------------------------- false alarms
def test_a_message_being_dispatched_is_never_reported_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads must refuse garbage, but must not call good data corrupt. A reader that runs while
    the dispatcher is between writing a message's queue entry and indexing it (index files are
    created and fsynced right there, so the window is wide) sees the new entry through
    max_offset; reading it must return the message or nothing, not CorruptRecordError."""
    s = start_store(store_config(tmp_path / "store"))
    outcomes: list[str] = []
    try:
        index = s.index
        assert index is not None
        real_build_index = index.build_index_many

        def read_tail() -> None:
            try:
                hi = s.max_offset("probe", 0)
                got = s.get_messages("probe", 0, hi - 1, 1).messages if hi else []
                outcomes.append(f"ok: max_offset {hi}, read {[m.body for m in got]}")
            except StoreError as e:
                outcomes.append(f"{type(e).__name__}: {e}")

        def build_index_with_a_reader(
            messages: Sequence[tuple[str, int, int, Sequence[bytes]]],
        ) -> None:  # runs in the dispatch thread, between queue entry and readable offset
            if any(m[0] == "probe" for m in messages) and not outcomes:
                reader = threading.Thread(target=read_tail)
                reader.start()
                reader.join(30)
                assert not reader.is_alive()
            real_build_index(messages)

        monkeypatch.setattr(index, "build_index_many", build_index_with_a_reader)
        r = s.put_messages([Message("probe", b"fresh", keys=["k"])])
        assert r.wait(30) is PutStatus.PUT_OK
        assert s.wait_dispatched(s.commitlog.max_offset, 30)
        assert [m.body for m in s.get_messages("probe", 0, 0).messages] == [b"fresh"]
    finally:
        s.close()
    assert len(outcomes) == 1
    assert outcomes[0] in ("ok: max_offset 0, read []", "ok: max_offset 1, read [b'fresh']"), (
        outcomes[0]
    )
