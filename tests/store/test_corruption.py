"""Damaged stores (etcd's repair_test, for the CommitLog, ConsumeQueues, checkpoint and index).

One driver: build a store with tiny files (closed cleanly, or its writer SIGKILLed), let a
``corrupt`` function damage it and say what must survive, reopen (recovery), then check that
exactly the survivors are readable every way, that appends continue at the right CommitLog and
queue offsets, that the offline checker is happy and that a second, clean reopen changes nothing.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.store.crash_harness import Writer
from tests.store.raw_log import (
    BODY_AT,
    commitlog_files,
    evidence,
    flip_bit,
    read_log,
    snapshot_log,
    zero_log,
)
from tests.store.store_checks import verify_exactly
from tests.store.workload import (
    FILE_SIZE,
    Ack,
    assert_matches,
    put_batches,
    start_store,
    store_config,
)
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
