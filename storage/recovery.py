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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tidemq.storage.checkpoint import Checkpoint
from tidemq.storage.commitlog import CommitLog
from tidemq.storage.consume_queue import ENTRY_SIZE
from tidemq.storage.dispatch import Dispatcher, DispatchGapError
from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.index_rebuild import HelperIndexSink
from tidemq.storage.index_service import IndexService
from tidemq.storage.queue_store import ConsumeQueueStore
from tidemq.storage.record import END_OF_FILE, OK, RecordInfo, check_record
from tidemq.storage.truncation import EvidenceWriter, rewind_indexes, truncate_log

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
    # Whether a helper process rebuilt the index (storage.index_rebuild), and why it failed if it
    # did (this process then indexed the rest itself).
    index_helper: bool
    index_helper_failure: str | None
    cut_bytes: int
    cut_reason: str | None
    evidence_files: list[str]
    seconds: float


def _valid_record_at(cl: CommitLog, offset: int) -> bool:
    f = cl.mfq.find_file(offset)
    if f is None:
        return False
    status, _ = check_record(f.mm, offset - f.base_offset, f.size, True, offset, cl.record_crc)
    return status == OK


def _is_mid_log(cl: CommitLog, at: int) -> bool:
    """Whether valid data follows the bad record at ``at`` (corruption, not a torn tail)."""
    f = cl.mfq.find_file(at)
    assert f is not None
    # The bad record's own length field, if sane, says where the next record should start.
    size = int.from_bytes(f.mm[at - f.base_offset : at - f.base_offset + 4], "big", signed=True)
    if 0 < size <= f.size - (at - f.base_offset) and _valid_record_at(cl, at + size):
        return True
    return any(_valid_record_at(cl, g.base_offset) for g in cl.mfq.files if g.base_offset > at)


def scan_commitlog(
    cl: CommitLog, start: int, stop: int | None = None
) -> tuple[int, int, int | None, str | None]:
    """CRC-check records from ``start``.

    Returns (end of valid data, records checked, offset of mid-log corruption or None, why the
    walk stopped)."""
    end = start
    count = 0
    limit = cl.mfq.files[-1].end_offset if stop is None else stop
    for at, status, info in cl.iter_records(start, limit, start):
        if status == OK:
            assert isinstance(info, RecordInfo)
            end = at + info.size
            count += 1
        elif status == END_OF_FILE:
            end = at - at % cl.file_size + cl.file_size
        else:
            # Zeros are where the data ends; anything else is a torn record. Either way it is
            # only a tail if nothing valid follows.
            if _is_mid_log(cl, at):
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
    index_helper_min_bytes: int | None = None,
    lock_fd: int | None = None,
) -> RecoveryReport:
    """Recover the store (see the module's docstring). ``index_helper_min_bytes``: once a pass
    has re-dispatched this many bytes, a helper process indexes the rest (None: never); it holds
    ``lock_fd``, the store lock, open for as long as it runs."""
    t0 = time.monotonic()
    # Index files lost since they were recorded: only a whole re-dispatch brings their keys back.
    index_lost = index is not None and index.end_phy_offset < index_end_expected
    # Queues are recovered one by one as they are first mapped (``queue_store``): here only
    # their files' names are compared with the manifest.
    files = cl.mfq.files
    if not files:
        # No CommitLog, nothing can be referenced: drop every queue and index file.
        queues.destroy_all()
        if index is not None:
            index.trim_to(0)
        return RecoveryReport(
            abnormal=abnormal,
            checkpoint_found=checkpoint is not None,
            scan_from=0,
            redispatch_from=0,
            end_offset=0,
            records_scanned=0,
            records_redispatched=0,
            full_redispatch=False,
            index_helper=False,
            index_helper_failure=None,
            cut_bytes=0,
            cut_reason=None,
            evidence_files=[],
            seconds=time.monotonic() - t0,
        )

    lo, hi = files[0].base_offset, files[-1].end_offset
    d = checkpoint.recovery_offset if checkpoint is not None else lo
    if not lo <= d <= hi:
        log.warning("checkpoint recovery offset %d outside the log [%d, %d]; full scan", d, lo, hi)
        d = lo
    full = _drop_damaged_queues(queues, manifest) or index_lost or not queues.queues
    if index_lost:
        log.warning("the index lost files; rebuilding it from the whole CommitLog")
    if full:
        d = lo
    if checkpoint is None or d == lo:
        scan_from = lo
    elif abnormal:
        scan_from = d
    else:
        # A clean shutdown: still re-validate the newest file, the one being written.
        holder = cl.mfq.find_file(d) or files[-1]
        scan_from = holder.base_offset
    scanned = 0
    if scan_from < d:
        # Below d nothing needs dispatching, only checking.
        end0, scanned, _, _ = scan_commitlog(cl, scan_from, d)
        if end0 < d:
            # Data the checkpoint called durable is damaged: dispatch again from the scan start,
            # where the pass below meets the same damage and judges it.
            d = scan_from
    # One pass from d: every record is CRC-checked and dispatched as it is read.
    helper = None if index is None else HelperIndexSink(index, index_helper_min_bytes, lock_fd)
    redispatched = _dispatch_pass(cl, queues, index, dispatcher, d, helper)
    if redispatched < 0:
        full, d = True, lo
        redispatched = _dispatch_pass(cl, queues, index, dispatcher, lo, helper)
    scanned += redispatched
    end = dispatcher.offset
    cut_reason: str | None = None
    if dispatcher.stopped_at is not None:
        at, _status, reason = dispatcher.stopped_at
        if _is_mid_log(cl, at):
            if not truncate_on_corruption:
                raise CorruptStoreError(
                    f"CommitLog corrupt at offset {at} ({reason}) with valid records after it; "
                    f"refusing to cut them. Inspect with `tidemq store check {root_dir}`; to cut "
                    f"the log there (the rest is kept under evidence/), open with "
                    f"truncate_on_corruption=True"
                )
            cut_reason = f"corruption at {at}: {reason}"
        else:
            cut_reason = f"torn tail after the last valid record ({reason})"
    evidence = EvidenceWriter(root_dir, "commitlog", cut_reason or "data past the end")
    truncate_log(cl, queues, index, dispatcher, end, evidence, exact=False)
    if evidence.total:
        log.warning(
            "cut %d bytes at CommitLog offset %d (%s); kept in %s",
            evidence.total,
            end,
            cut_reason,
            evidence.paths,
        )
    queues.correct_min_offsets(cl.min_offset)
    return RecoveryReport(
        abnormal=abnormal,
        checkpoint_found=checkpoint is not None,
        scan_from=min(scan_from, d),
        redispatch_from=d,
        end_offset=end,
        records_scanned=scanned,
        records_redispatched=redispatched,
        full_redispatch=full,
        index_helper=helper is not None and helper.used,
        index_helper_failure=None if helper is None else helper.failure,
        cut_bytes=evidence.total,
        cut_reason=cut_reason if evidence.total else None,
        evidence_files=evidence.paths,
        seconds=time.monotonic() - t0,
    )


def _drop_damaged_queues(
    queues: ConsumeQueueStore, manifest: dict[tuple[str, int], tuple[int, int]]
) -> bool:
    """Delete queues that lost files (their files, by name, span less at either end than the
    manifest recorded, or could not be loaded); True when any needs rebuilding from the whole
    log. Names only: a queue's entries are read when it is first used (``queue_store``)."""
    damaged = bool(queues.damaged)
    for key, (min_q, max_q) in manifest.items():
        cq = queues.get(*key)
        if cq is not None:
            first, end = cq.names_range
            if first // ENTRY_SIZE <= min_q and end >= max_q * ENTRY_SIZE:
                continue
            log.warning("ConsumeQueue %s/%d lost files; rebuilding it", *key)
            queues.drop(key)
        damaged = True
    return damaged


def _dispatch_pass(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService | None,
    dispatcher: Dispatcher,
    start: int,
    helper: HelperIndexSink | None,
) -> int:
    """Trim queues and index to ``start``, then CRC-check and dispatch every record after it
    until the data ends. Returns the records dispatched, or -1 when a gap shows that queue
    entries before ``start`` are missing."""
    cut = max(start, cl.min_offset)
    rewind_indexes(cl, queues, index, cut)
    cl.trusted_end = cut
    dispatcher.offset = cut
    dispatcher.error = None
    if helper is None:
        return _dispatch_from(cl, dispatcher, cut)
    helper.begin(cut)
    dispatcher.index_sink = helper
    try:
        count = _dispatch_from(cl, dispatcher, cut)
    except BaseException:
        helper.abandon()
        raise
    finally:
        dispatcher.index_sink = None
    helper.finish(dispatcher, count >= 0, prefill=cut == cl.min_offset)
    return count


def _dispatch_from(cl: CommitLog, dispatcher: Dispatcher, cut: int) -> int:
    end = cl.mfq.files[-1].end_offset
    try:
        return dispatcher.dispatch(end, allow_prefill=cut == cl.min_offset, verify_from=cut)
    except DispatchGapError as e:
        if cut == cl.min_offset:
            raise
        log.warning("%s; re-dispatching the whole CommitLog", e)
        return -1


def report_json(report: RecoveryReport) -> str:
    return json.dumps(asdict(report))


ProgressFn = Callable[[int], None]
