"""MessageStore: the store a broker embeds. Wires CommitLog, ConsumeQueues, index, dispatch,
flush, checkpoint, retention and recovery, and is the only API the broker uses.

Threads: callers append under one put lock (a single appender at a time); ``commitlog-flush``
flushes (and serves group commits); ``flush-watcher`` times out sync flushes; ``dispatch`` builds
ConsumeQueue and index entries; ``housekeeping`` flushes queues, writes the checkpoint and runs
retention; ``commitlog-warm`` brings the pages ahead of the writer into the page cache. Nothing
here uses asyncio: the broker wraps the returned futures.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from tidemq.storage.atomic_file import fsync_dir, read_json_with_fallback, write_json_atomic
from tidemq.storage.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from tidemq.storage.commitlog import CommitLog
from tidemq.storage.config import FlushMode, StoreConfig
from tidemq.storage.consume_queue import ConsumeQueue, is_blank
from tidemq.storage.dispatch import ConsumeQueueStore, Dispatcher, DispatchListener
from tidemq.storage.errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    MessageNotFoundError,
    OffsetBelowMinError,
    OffsetBeyondMaxError,
    StoreClosedError,
    StoreError,
    StoreNotWritableError,
    TailNotAlignedError,
)
from tidemq.storage.flush import FlushService
from tidemq.storage.index_service import IndexService
from tidemq.storage.javahash import tag_code
from tidemq.storage.lock import StoreLock
from tidemq.storage.record import AppendResult, Message, StoredMessage, parse_msg_id
from tidemq.storage.recovery import EvidenceWriter, RecoveryReport, recover
from tidemq.storage.results import PutStatus
from tidemq.storage.retention import RetentionDecision, decide, expired_file_count
from tidemq.storage.warm import PageWarmer

log = logging.getLogger(__name__)

LAYOUT_FILE = "store.json"
MANIFEST_FILE = os.path.join("consumequeue", "queues.json")
FORMAT_VERSION = 1
QUERY_MAX_NUM = 64
DISPATCH_SLICE_RECORDS = 1024


@dataclass
class PutResult:
    results: list[AppendResult]
    durable: Future[PutStatus]

    def wait(self, timeout_s: float | None = None) -> PutStatus:
        return self.durable.result(timeout_s)


@dataclass
class GetResult:
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass
class StoreStats:
    commitlog_min_offset: int
    commitlog_max_offset: int
    flushed_offset: int
    dispatched_offset: int
    disk_usage_ratio: float
    writable: bool
    queues: int
    recovery: RecoveryReport | None = field(default=None)


def _done(status: PutStatus) -> Future[PutStatus]:
    f: Future[PutStatus] = Future()
    f.set_result(status)
    return f


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        *,
        disk_usage_ratio: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.root = config.root_dir
        self._disk_usage = disk_usage_ratio or self._measure_disk_usage
        self._clock = clock
        self.commitlog = CommitLog(
            self.root, config.commitlog_file_size_bytes, config.store_host_packed, config.record_crc
        )
        self.queues = ConsumeQueueStore(self.root, config.consume_queue_entries_per_file)
        self.index: IndexService | None = (
            IndexService(
                os.path.join(self.root, "index"), config.index_slot_num, config.index_max_num
            )
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(self.commitlog, self.queues, self.index)
        self._lock = StoreLock(self.root)
        self._put_lock = threading.Lock()
        # Re-entrant: truncation holds it while writing the checkpoint, which takes it too.
        self._dispatch_lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._dispatch_cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._flusher: FlushService | None = None
        self.warmer: PageWarmer | None = None
        self._disk_full = False
        self._fatal: BaseException | None = None
        self._open = False
        self._manifest_keys: frozenset[tuple[str, int]] = frozenset()
        self._manifest_index_files = -1
        self.recovery: RecoveryReport | None = None

    # ================================================================= lifecycle
    def open(self) -> MessageStore:
        os.makedirs(self.root, exist_ok=True)
        self._lock.acquire()
        try:
            self._check_layout()
            abort = os.path.join(self.root, "abort")
            abnormal = os.path.exists(abort)
            self.commitlog.mfq.load()
            self.queues.load()
            if self.index is not None:
                self.index.load()
            manifest, index_end = self._read_manifest()
            self.recovery = recover(
                self.commitlog,
                self.queues,
                self.index,
                self.dispatcher,
                read_checkpoint(self.root),
                abnormal=abnormal,
                root_dir=self.root,
                truncate_on_corruption=self.config.truncate_on_corruption,
                manifest=manifest,
                index_end_expected=index_end,
                index_helper_min_bytes=self.config.recovery_index_helper_min_bytes,
                lock_fd=self._lock.fileno(),
            )
            log.info("store %s recovered: %s", self.root, self.recovery)
            self._write_checkpoint()
            self._write_manifest()
            with open(abort, "w") as f:
                f.write(f"{os.getpid()}\n")
            fsync_dir(self.root)
            self._start_services()
        except BaseException:
            self._close_files()
            self._lock.release()
            raise
        self._open = True
        return self

    def __enter__(self) -> MessageStore:
        return self.open() if not self._open else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_layout(self) -> None:
        path = os.path.join(self.root, LAYOUT_FILE)
        want = {
            "format_version": FORMAT_VERSION,
            "commitlog_file_size_bytes": self.config.commitlog_file_size_bytes,
            "consume_queue_entries_per_file": self.config.consume_queue_entries_per_file,
            "index_slot_num": self.config.index_slot_num,
            "index_max_num": self.config.index_max_num,
            "record_crc": self.config.record_crc,
        }
        have = read_json_with_fallback(path)
        if have is None:
            if os.path.isdir(os.path.join(self.root, "commitlog")):
                raise ConfigError(f"{self.root} holds a CommitLog but no {LAYOUT_FILE}")
            write_json_atomic(path, want)
            return
        diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
        if diff:
            raise ConfigError(
                f"store {self.root} was created with a different layout "
                f"(stored, configured): {diff}"
            )

    def _start_services(self) -> None:
        cfg = self.config
        flusher = FlushService(
            self._flush_commitlog,
            sync=cfg.flush_mode is FlushMode.SYNC,
            interval_ms=cfg.flush_interval_ms,
            least_pages=cfg.flush_least_pages,
            thorough_interval_ms=cfg.flush_thorough_interval_ms,
            sync_timeout_ms=cfg.sync_flush_timeout_ms,
            on_flushed=lambda _off: self._wake_dispatch(),
            on_error=self._on_fatal,
        )
        self._flusher = flusher
        flusher.start()
        if cfg.warm_ahead_bytes:
            self.warmer = PageWarmer(
                lambda: self.commitlog.mfq.last_file, ahead_bytes=cfg.warm_ahead_bytes
            )
            self.warmer.start()
        self._threads = [
            threading.Thread(target=self._dispatch_loop, name="dispatch", daemon=True),
            threading.Thread(target=self._housekeeping_loop, name="housekeeping", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Graceful stop: flush and dispatch everything, checkpoint, remove the abort file."""
        if not self._open:
            return
        with self._put_lock:
            self._open = False
        assert self._flusher is not None
        self._flusher.stop()
        if self.warmer is not None:
            self.warmer.stop()
        self._stop.set()
        self._wake_dispatch()
        for t in self._threads:
            t.join()
        clean = False
        if self._fatal is None:
            with self._dispatch_lock:
                self._dispatch_step()
            self.queues.flush()
            if self.index is not None:
                self.index.flush()
            self._write_checkpoint()
            self._write_manifest()
            clean = (
                self.dispatcher.offset >= self.commitlog.max_offset and not self.dispatcher.error
            )
        if clean:
            # Only a store with nothing left to dispatch may skip abnormal recovery next time.
            os.unlink(os.path.join(self.root, "abort"))
            fsync_dir(self.root)
        self._close_files()
        self._lock.release()

    def _close_files(self) -> None:
        self.commitlog.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()

    def _on_fatal(self, exc: BaseException) -> None:
        self._fatal = exc

    # ================================================================= writes
    def _check_writable(self) -> None:
        if not self._open:
            raise StoreClosedError(f"store {self.root} is closed")
        if self._fatal is not None:
            raise StoreNotWritableError(f"store stopped accepting writes after: {self._fatal}")
        if self._disk_full:
            raise DiskFullError(
                f"disk usage above {self.config.disk_space_warning_level_ratio:.0%}; writes resume "
                f"when retention frees space"
            )

    def put_messages(self, messages: Sequence[Message]) -> PutResult:
        """Append a batch; all messages are validated before any byte is written."""
        cfg = self.config
        if not messages:
            return PutResult([], _done(PutStatus.PUT_OK))
        with self._put_lock:
            self._check_writable()
            if self.commitlog.last_write_raw:
                self._require_aligned_tail()
            results = self.commitlog.put(messages, cfg.max_message_body_bytes)
            end = self.commitlog.max_offset
        flusher = self._flusher
        assert flusher is not None
        if cfg.flush_mode is FlushMode.SYNC:
            durable = flusher.submit(end)
        else:
            durable = _done(PutStatus.PUT_OK)
            self._wake_dispatch()
        return PutResult(results, durable)

    def put_message(self, message: Message) -> PutResult:
        return self.put_messages([message])

    def _require_aligned_tail(self) -> None:
        with self._dispatch_lock:
            self._dispatch_step()
        if self.dispatcher.offset != self.commitlog.max_offset:
            raise TailNotAlignedError(
                f"the log ends inside a replicated record at {self.dispatcher.offset}; truncate "
                f"to a record boundary before appending locally"
            )

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        """Append replicated CommitLog bytes; returns the new end of the log."""
        with self._put_lock:
            if not self._open:
                raise StoreClosedError(f"store {self.root} is closed")
            if self._fatal is not None:
                raise StoreNotWritableError(f"store stopped accepting writes after: {self._fatal}")
            end = self.commitlog.append_raw(offset, data)
        self._wake_dispatch()
        return end

    def truncate_to(self, offset: int, reason: str) -> int:
        """Cut the log back to ``offset`` (a record boundary at or below the end), keeping the cut
        bytes as evidence; ConsumeQueues and index follow. Returns the bytes cut."""
        with self._put_lock, self._dispatch_lock:
            cl = self.commitlog
            if not cl.min_offset <= offset <= cl.max_offset:
                raise StoreError(
                    f"cannot truncate to {offset}: log spans [{cl.min_offset}, {cl.max_offset}]"
                )
            if offset > self.dispatcher.offset:
                self._dispatch_step()
            if offset > self.dispatcher.offset:
                raise StoreError(f"{offset} is past the last whole record {self.dispatcher.offset}")
            evidence = EvidenceWriter(self.root, "commitlog", reason)
            for cq in self.queues.all():
                cq.truncate_phy(offset)
            if self.index is not None:
                self.index.trim_to(offset)
            cl.mfq.truncate(offset, evidence, exact=True)
            cl.mfq.set_positions(offset)
            cl.trusted_end = min(cl.trusted_end, offset)
            cl.topic_queue_table = {k: cq.max_offset for k, cq in self.queues.queues.items()}
            self.dispatcher.offset = min(self.dispatcher.offset, offset)
            self.dispatcher.error = None
            cl.last_write_raw = False
            self._write_checkpoint()
            self._write_manifest(force=True)
            return evidence.total

    def cut_partial_tail(self, reason: str) -> int:
        """Make a log that took replicated bytes ready for local appends: a record half-received
        when the stream stopped is cut (kept as evidence). Returns the bytes cut; the caller must
        have stopped raw appends."""
        self._flush_commitlog(0)  # under sync flush, dispatch stops at the flushed offset
        self.dispatch_now()
        end = self.dispatcher.offset
        if end >= self.commitlog.max_offset or self.dispatcher.error is not None:
            return 0
        return self.truncate_to(end, reason)

    # ================================================================= flush / dispatch
    def _flush_commitlog(self, least_pages: int) -> int:
        with self._flush_lock:
            return self.commitlog.flush(least_pages)

    def _dispatch_end(self) -> int:
        if self.config.flush_mode is FlushMode.SYNC:
            return min(self.commitlog.mfq.flushed_offset, self.commitlog.max_offset)
        return self.commitlog.max_offset

    def _dispatch_step(self, max_records: int | None = None) -> int:
        return self.dispatcher.dispatch(self._dispatch_end(), max_records=max_records)

    def _wake_dispatch(self) -> None:
        with self._dispatch_cond:
            self._dispatch_cond.notify_all()

    def _dispatch_loop(self) -> None:
        while not self._stop.is_set():
            with self._dispatch_cond:
                if self.dispatcher.offset >= self._dispatch_end() or self.dispatcher.error:
                    self._dispatch_cond.wait(0.5)
            try:
                # Bounded slices: the checkpoint, retention and truncation take this lock too, and
                # must not wait behind a whole backlog.
                with self._dispatch_lock:
                    self._dispatch_step(DISPATCH_SLICE_RECORDS)
            except StoreError as e:
                if self.dispatcher.error is None:
                    log.exception("dispatch stopped")
                self.dispatcher.error = CorruptRecordError(self.dispatcher.offset, str(e))
            except Exception as e:  # a broken dispatcher must stop writes, loudly
                log.exception("dispatch failed; the store stops accepting writes")
                self._fatal = e
                self.dispatcher.error = CorruptRecordError(self.dispatcher.offset, repr(e))

    def dispatch_now(self) -> int:
        """Dispatch whatever is ready, in the caller's thread (tools, tests, benchmarks)."""
        with self._dispatch_lock:
            return self._dispatch_step()

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        self.dispatcher.listeners.append(listener)

    def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Block until every record below ``offset`` is dispatched (tests and shutdown paths)."""
        deadline = time.monotonic() + timeout_s
        while self.dispatcher.offset < offset:
            if time.monotonic() > deadline:
                return False
            self._wake_dispatch()
            time.sleep(0.001)
        return True

    # ================================================================= housekeeping
    def _housekeeping_loop(self) -> None:
        cfg = self.config
        period_s = min(cfg.checkpoint_interval_ms, cfg.consume_queue_flush_interval_ms) / 1000
        next_clean = time.monotonic() + cfg.clean_resource_interval_ms / 1000
        while not self._stop.wait(period_s):
            try:
                self.queues.flush(2)
                self._write_checkpoint()
                self._write_manifest()
                if time.monotonic() >= next_clean:
                    next_clean = time.monotonic() + cfg.clean_resource_interval_ms / 1000
                    self.run_retention()
            except Exception as e:
                log.exception("housekeeping failed; the store stops accepting writes")
                self._fatal = e

    def _write_checkpoint(self) -> None:
        """Make everything below the dispatched offset durable, then record that offset."""
        with self._dispatch_lock:
            d = self.dispatcher.offset
            logics_ts = self.dispatcher.last_store_timestamp_ms
        if self.commitlog.mfq.flushed_offset < d:
            self._flush_commitlog(0)
        self.queues.flush()
        index_ts = 0
        if self.index is not None:
            self.index.flush()
            index_ts = logics_ts
        cp = Checkpoint(
            physic_msg_timestamp_ms=self.commitlog.last_store_timestamp_ms,
            logics_msg_timestamp_ms=logics_ts,
            index_msg_timestamp_ms=index_ts,
            master_flushed_offset=self.commitlog.mfq.flushed_offset,
            recovery_offset=d,
        )
        write_checkpoint(self.root, cp)

    def _read_manifest(self) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
        """Queues with their (min, max) offsets, and the index's end offset, as last recorded."""
        raw = read_json_with_fallback(os.path.join(self.root, MANIFEST_FILE)) or {}
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, qs in raw.get("queues", {}).items():
            for qid, (min_q, max_q) in qs.items():
                out[topic, int(qid)] = (int(min_q), int(max_q))
        self._manifest_keys = frozenset(out)
        return out, int(raw.get("index_end_phy_offset", -1))

    def _write_manifest(self, *, force: bool = False) -> None:
        """Record which queues exist with their offset range, and how far the index reaches, so
        recovery notices lost files. Rewritten when the set of queues or of index files changes,
        after retention and truncation, and at shutdown."""
        keys = frozenset(self.queues.queues)
        index_files = len(self.index.files) if self.index is not None else 0
        if (
            not force
            and self._open
            and keys == self._manifest_keys
            and index_files == self._manifest_index_files
        ):
            return
        table: dict[str, dict[str, list[int]]] = {}
        for (topic, qid), cq in self.queues.queues.items():
            table.setdefault(topic, {})[str(qid)] = [cq.min_offset, cq.max_offset]
        os.makedirs(os.path.join(self.root, "consumequeue"), exist_ok=True)
        index_end = self.index.end_phy_offset if self.index is not None else -1
        write_json_atomic(
            os.path.join(self.root, MANIFEST_FILE),
            {"queues": table, "index_end_phy_offset": index_end},
        )
        self._manifest_keys = keys
        self._manifest_index_files = index_files

    # ================================================================= retention
    def _measure_disk_usage(self) -> float:
        u = shutil.disk_usage(self.root)
        return u.used / u.total if u.total else 0.0

    def run_retention(self, *, now_s: float | None = None, manual: bool = False) -> int:
        """One retention pass (RocketMQ's CleanCommitLogService); returns files deleted."""
        cfg = self.config
        now = self._clock() if now_s is None else now_s
        usage = self._disk_usage()
        decision: RetentionDecision = decide(cfg, usage, time.localtime(now).tm_hour, manual)
        if decision.disk_full != self._disk_full:
            log.warning(
                "disk usage %.1f%%: writes %s",
                usage * 100,
                "refused" if decision.disk_full else "accepted again",
            )
            self._disk_full = decision.disk_full
        if not decision.delete:
            return 0
        with self._put_lock, self._dispatch_lock:
            files = self.commitlog.mfq.files
            # Never delete what is not dispatched yet: its queue entries do not exist.
            eligible = [f for f in files[:-1] if f.end_offset <= self.dispatcher.offset]
            n = expired_file_count(
                [f.mtime() for f in eligible],
                now,
                cfg.file_reserved_time_hours * 3600,
                force=decision.force,
                batch_max=cfg.delete_file_batch_max,
            )
            if n == 0:
                return 0
            self.commitlog.mfq.delete_head(n)
            cl_min = self.commitlog.min_offset
            for cq in self.queues.all():
                cq.delete_expired(cl_min)
            if self.index is not None:
                self.index.delete_files_below(cl_min)
        self._write_manifest(force=True)
        log.info("retention deleted %d CommitLog file(s); min offset now %d", n, cl_min)
        return n

    # ================================================================= reads
    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get(topic, queue_id)
        return self._visible_max(cq, self.dispatcher.offset) if cq is not None else 0

    @staticmethod
    def _visible_max(cq: ConsumeQueue, readable: int) -> int:
        """The queue's max offset, not counting an entry whose record dispatch has not published
        yet (dispatch writes the entry first; for one queue at most one is in flight)."""
        hi = cq.max_offset
        last = cq.get(hi - 1) if hi > cq.min_offset else None
        if last is not None and last[0] + last[1] > readable and not is_blank(last[0], last[1]):
            return hi - 1
        return hi

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tags: Sequence[str] | None = None,
        max_commitlog_offset: int | None = None,
    ) -> GetResult:
        """Messages of one queue from ``offset``: at most ``max_count``, and no more than
        ``max_bytes`` of records unless the first alone is larger. ``tags`` keeps only messages
        with one of those tags (None or ``*``: all). ``max_commitlog_offset`` hides records
        that end beyond it (a master's confirm offset): the read stops before them as it stops
        before records dispatch has not published, so the range checks are unaffected."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            if offset > 0:
                raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, 0)
            return GetResult([], 0, 0, 0)
        readable = self.dispatcher.offset
        lo, hi = cq.min_offset, self._visible_max(cq, readable)
        if offset < lo:
            raise OffsetBelowMinError(f"queue offset of {topic}/{queue_id}", offset, lo)
        if offset > hi:
            raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, hi)
        wanted = None if not tags or "*" in tags else {tag_code(t) for t in tags}
        tag_set = set(tags) if wanted is not None and tags else None
        out: list[StoredMessage] = []
        total = 0
        q = offset
        scan_budget = max(max_count * 16, 256)  # bound the work a selective filter can cause
        visible = readable if max_commitlog_offset is None else min(readable, max_commitlog_offset)
        while q < hi and len(out) < max_count and scan_budget > 0:
            entries = cq.read(q, min(max_count * 4, scan_budget))
            if not entries:
                break
            for phy, size, code in entries:
                scan_budget -= 1
                if phy + size > visible:
                    # Dispatch wrote the entry but has not published its offset yet (or it is
                    # past the confirm offset).
                    return GetResult(out, q, lo, hi)
                if wanted is not None and code not in wanted:
                    q += 1
                    continue
                if out and total + size > max_bytes:
                    return GetResult(out, q, lo, hi)
                msg = self.commitlog.read(phy, size, readable)
                q += 1
                if tag_set is not None and msg.tags not in tag_set:
                    continue  # a tag-hash collision
                out.append(msg)
                total += size
                if len(out) >= max_count:
                    break
        return GetResult(out, q, lo, hi)

    def look_message(self, phy_offset: int) -> StoredMessage:
        if phy_offset >= self.dispatcher.offset:
            raise MessageNotFoundError(f"no whole record at CommitLog offset {phy_offset}")
        return self.commitlog.read(phy_offset, None, self.dispatcher.offset)

    def get_message_by_id(self, msg_id: str) -> StoredMessage:
        host, phy = parse_msg_id(msg_id)
        if host != self.config.store_host_packed:
            raise MessageNotFoundError(f"message id {msg_id} belongs to another store host")
        try:
            return self.look_message(phy)
        except CorruptRecordError as e:
            raise MessageNotFoundError(f"message id {msg_id}: {e.reason}") from e

    def query_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**63 - 1, max_num: int = 32
    ) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (KEYS or UNIQ_KEY) stored within the range."""
        if self.index is None:
            return []
        max_num = min(max_num, QUERY_MAX_NUM)
        out: list[StoredMessage] = []
        for phy in self.index.query(topic, key, max_num * 2, begin_ms, end_ms):
            try:
                msg = self.look_message(phy)
            except (OffsetBelowMinError, MessageNotFoundError, CorruptRecordError):
                continue
            if msg.topic == topic and (key in msg.keys or msg.properties.get("UNIQ_KEY") == key):
                out.append(msg)
                if len(out) >= max_num:
                    break
        return out

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``."""
        cq = self.queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(
            timestamp_ms, lambda phy, _size: self.commitlog.store_timestamp(phy)
        )

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        return self.commitlog.read_raw(offset, max_bytes)

    def stats(self) -> StoreStats:
        cl = self.commitlog
        return StoreStats(
            commitlog_min_offset=cl.min_offset,
            commitlog_max_offset=cl.max_offset,
            flushed_offset=cl.mfq.flushed_offset,
            dispatched_offset=self.dispatcher.offset,
            disk_usage_ratio=self._disk_usage(),
            writable=self._open and self._fatal is None and not self._disk_full,
            queues=len(self.queues.queues),
            recovery=self.recovery,
        )

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self.queues.queues):
            out.setdefault(topic, []).append(qid)
        return out


__all__ = ["GetResult", "MessageStore", "PutResult", "StoreStats"]
