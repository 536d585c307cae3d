"""Crash recovery: bring CommitLog, ConsumeQueues and index back to one consistent state.

The CommitLog is the truth. Recovery
1. recovers each ConsumeQueue to its last valid entry (spec §3.2);
2. scans the CommitLog with CRC checks from a start point: after a clean shutdown the start of the
   file holding the checkpoint's recovery offset, after a crash the recovery offset itself (every
   byte below it was flushed and dispatched), and with no usable checkpoint the first file;
3. finds where valid data ends. A torn tail (a bad record with nothing valid after it) is cut, and
   unlike RocketMQ the cut bytes are zeroed and saved under ``evidence/``. A bad record *followed by
   valid ones* is corruption in the middle of the log: the store refuses to open (a crash cannot
   cause it, so an operator must look) unless ``truncate_on_corruption`` says to cut there too;
4. trims ConsumeQueues and index to the recovery offset and re-dispatches everything after it, so
   undispatched records at shutdown (RocketMQ #467) become readable and nothing points past the end.
   If a ConsumeQueue turns out to miss entries (files deleted), the whole log is re-dispatched.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from storage.atomic_file import fsync_dir
from storage.checkpoint import Checkpoint
from storage.commitlog import CommitLog
from storage.consume_queue import ENTRY_SIZE
from storage.dispatch import ConsumeQueueStore, Dispatcher, DispatchGapError
from storage.errors import CorruptStoreError
from storage.index_file import IndexService
from storage.record import END_OF_FILE, OK, RecordInfo, check_record

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    abnormal: bool
    checkpoint_found: bool
    scan_from: int
    redispatch_from: int
    end_offset: int
    records_scanned: int
    records_redispatched: int
    full_redispatch: bool
    cut_bytes: int
    cut_reason: str | None
    evidence_files: list[str]
    seconds: float


class EvidenceWriter:
    """Saves bytes removed from the store, with a JSON note of why, under ``{root}/evidence/``."""

    def __init__(self, root_dir: str, kind: str, reason: str) -> None:
        self.directory = os.path.join(root_dir, "evidence")
        self.kind = kind
        self.reason = reason
        self.paths: list[str] = []
        self.total = 0

    def __call__(self, offset: int, data: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        stem = os.path.join(
            self.directory, f"{self.kind}-{offset:020d}-{time.time_ns() // 1_000_000}"
        )
        with open(stem + ".bin", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        note = {"kind": self.kind, "offset": offset, "length": len(data), "reason": self.reason}
        with open(stem + ".json", "w") as f:
            json.dump(note, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        self.paths.append(stem + ".bin")
        self.total += len(data)


def _valid_record_at(cl: CommitLog, offset: int) -> bool:
    f = cl.mfq.find_file(offset)
    if f is None:
        return False
    status, _ = check_record(f.mm, offset - f.base_offset, f.size, True, offset, cl.record_crc)
    return status == OK


def _is_mid_log(cl: CommitLog, at: int, info: object) -> bool:
    """Whether valid data follows the bad record at ``at`` (corruption, not a torn tail)."""
    f = cl.mfq.find_file(at)
    assert f is not None
    # The bad record's own length field, if sane, says where the next record should start.
    size = int.from_bytes(f.mm[at - f.base_offset : at - f.base_offset + 4], "big", signed=True)
    if 0 < size <= f.size - (at - f.base_offset) and _valid_record_at(cl, at + size):
        return True
    return any(_valid_record_at(cl, g.base_offset) for g in cl.mfq.files if g.base_offset > at)


def scan_commitlog(cl: CommitLog, start: int) -> tuple[int, int, int | None, str | None]:
    """CRC-check records from ``start``.

    Returns (end of valid data, records checked, offset of mid-log corruption or None, why the
    walk stopped)."""
    end = start
    count = 0
    for at, status, info in cl.iter_records(start, cl.mfq.files[-1].end_offset, start):
        if status == OK:
            assert isinstance(info, RecordInfo)
            end = at + info.size
            count += 1
        elif status == END_OF_FILE:
            end = at - at % cl.file_size + cl.file_size
        else:
            # Zeros are where the data ends; anything else is a torn record. Either way it is
            # only a tail if nothing valid follows.
            if _is_mid_log(cl, at, info):
                return end, count, at, str(info)
            return end, count, None, str(info)
    return end, count, None, None


def recover(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService | None,
    dispatcher: Dispatcher,
    checkpoint: Checkpoint | None,
    *,
    abnormal: bool,
    root_dir: str,
    truncate_on_corruption: bool,
    manifest: dict[tuple[str, int], tuple[int, int]],
    index_end_expected: int = -1,
) -> RecoveryReport:
    t0 = time.monotonic()
    # Index files lost since they were recorded: only a whole re-dispatch brings their keys back.
    index_lost = index is not None and index.end_phy_offset < index_end_expected
    for queue in queues.all():
        queue.recover()
    files = cl.mfq.files
    if not files:
        # No CommitLog, nothing can be referenced: drop every queue and index file.
        for queue in queues.all():
            queue.mfq.destroy()
        queues.queues = {}
        if index is not None:
            index.trim_to(0)
        return RecoveryReport(
            abnormal,
            checkpoint is not None,
            0,
            0,
            0,
            0,
            0,
            False,
            0,
            None,
            [],
            time.monotonic() - t0,
        )

    lo, hi = files[0].base_offset, files[-1].end_offset
    d = checkpoint.recovery_offset if checkpoint is not None else lo
    if not lo <= d <= hi:
        log.warning("checkpoint recovery offset %d outside the log [%d, %d]; full scan", d, lo, hi)
        d = lo
    if checkpoint is None or d == lo:
        scan_from = lo
    elif abnormal:
        scan_from = d
    else:
        # A clean shutdown: still re-validate the newest file, the one being written.
        holder = cl.mfq.find_file(d) or files[-1]
        scan_from = holder.base_offset
    end, scanned, bad_at, reason = scan_commitlog(cl, scan_from)
    if end < d:
        # Data the checkpoint called durable is gone or damaged: re-dispatch from the scan start.
        d = scan_from
    cut_reason = None
    if bad_at is not None:
        if not truncate_on_corruption:
            raise CorruptStoreError(
                f"CommitLog corrupt at offset {bad_at} ({reason}) with valid records after it; "
                f"refusing to cut them. Inspect with `tidemq store check {root_dir}`; to cut the "
                f"log "
                f"there (the rest is kept under evidence/), open with truncate_on_corruption=True"
            )
        cut_reason = f"corruption at {bad_at}: {reason}"
    else:
        cut_reason = f"torn tail after the last valid record ({reason})"
    evidence = EvidenceWriter(root_dir, "commitlog", cut_reason)
    cl.mfq.truncate(end, evidence)
    cl.mfq.set_positions(end)
    cl.trusted_end = end
    if evidence.total:
        log.warning(
            "cut %d bytes at CommitLog offset %d (%s); kept in %s",
            evidence.total,
            end,
            cut_reason,
            evidence.paths,
        )

    redispatch_from = d
    # A queue shorter at either end than the manifest says lost files: rebuild it from scratch.
    damaged = []
    for key, (min_q, max_q) in manifest.items():
        cq = queues.get(*key)
        if cq is None or cq.mfq.min_offset // ENTRY_SIZE > min_q or cq.max_offset < max_q:
            damaged.append(key)
            if cq is not None:
                log.warning("ConsumeQueue %s/%d lost files; rebuilding it", *key)
                cq.mfq.destroy()
                del queues.queues[key]
    if index_lost:
        log.warning("the index lost files; rebuilding it from the whole CommitLog")
    full = bool(damaged) or bool(queues.damaged) or index_lost or (not queues.queues and end > lo)
    if full:
        redispatch_from = lo
    redispatched = _redispatch(cl, queues, index, dispatcher, redispatch_from, end)
    if redispatched < 0:
        full = True
        redispatched = _redispatch(cl, queues, index, dispatcher, lo, end, trim=False)
    for cq in queues.all():
        cq.correct_min_offset(cl.min_offset)
    if dispatcher.offset < end and dispatcher.error is not None:
        raise CorruptStoreError(f"re-dispatch stopped: {dispatcher.error}")
    return RecoveryReport(
        abnormal=abnormal,
        checkpoint_found=checkpoint is not None,
        scan_from=scan_from,
        redispatch_from=redispatch_from if not full else lo,
        end_offset=end,
        records_scanned=scanned,
        records_redispatched=redispatched,
        full_redispatch=full,
        cut_bytes=evidence.total,
        cut_reason=cut_reason if evidence.total else None,
        evidence_files=evidence.paths,
        seconds=time.monotonic() - t0,
    )


def _redispatch(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService | None,
    dispatcher: Dispatcher,
    start: int,
    end: int,
    *,
    trim: bool = True,
) -> int:
    """Trim queues and index to ``start`` and dispatch [start, end). -1 when a gap shows that
    entries before ``start`` are missing."""
    cut = max(start, cl.min_offset)
    if trim:
        for cq in queues.all():
            cq.truncate_phy(cut)
        if index is not None:
            index.trim_to(cut)
    cl.topic_queue_table = {key: cq.max_offset for key, cq in queues.queues.items()}
    dispatcher.offset = cut
    dispatcher.error = None
    try:
        return dispatcher.dispatch(end, allow_prefill=cut == cl.min_offset)
    except DispatchGapError as e:
        if cut == cl.min_offset:
            raise
        log.warning("%s; re-dispatching the whole CommitLog", e)
        return -1


def report_json(report: RecoveryReport) -> str:
    return json.dumps(asdict(report))


ProgressFn = Callable[[int], None]
