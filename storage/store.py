"""MessageStore: the store a broker embeds, and the only API the broker uses.

A small facade over the modules that do the work: ``parts`` (CommitLog, ConsumeQueues, index,
dispatcher and their locks), ``lifecycle`` (open, close, and the flush, dispatch, housekeeping and
warming threads), ``reads``, ``cleaner`` (the retention pass), ``truncation``, ``manifest`` (the
layout and queue files), ``recovery`` and ``answers`` (what a put and ``stats`` return). Appends
are here: one appender at a time, under the put lock. Code outside the store reads the log
through ``log`` (a ``CommitLogReader``) and the accessors below, never through the parts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import TypeVar

from tidemq.storage.answers import BlockPutResult, PutResult, StoreStats, done_future
from tidemq.storage.archive.archiver import Archiver
from tidemq.storage.cleaner import Cleaner, QueuePosition, RetentionCounts
from tidemq.storage.commitlog import CommitLog
from tidemq.storage.config import StoreConfig
from tidemq.storage.dispatch import DispatchListener
from tidemq.storage.errors import (
    DiskFailedError,
    DiskFullError,
    StoreClosedError,
    StoreError,
    StoreNotWritableError,
    TailNotAlignedError,
)
from tidemq.storage.failure import DISK_IO, FailureListener, StoreFailure
from tidemq.storage.lifecycle import StoreLifecycle
from tidemq.storage.log_reader import CommitLogReader
from tidemq.storage.pages import PageStats
from tidemq.storage.parts import StoreParts
from tidemq.storage.reads import GetResult, QueueEntry, RecordsResult, StoreReader
from tidemq.storage.record import Message, SentBlock, StoredMessage
from tidemq.storage.recovery import RecoveryReport
from tidemq.storage.results import PutStatus
from tidemq.storage.set_aside import restart_empty_at
from tidemq.storage.truncation import EvidenceWriter, truncate_log

T = TypeVar("T")


class MessageStore:
    """``commitlog``, ``queues``, ``index`` and ``dispatcher`` are the store's own parts, there
    for its tests and tools; everything else goes through the methods and accessors."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        disk_usage_ratio: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.root = config.root_dir
        self._parts = parts = StoreParts(config)
        self.commitlog = parts.commitlog
        self.queues = parts.queues
        self.index = parts.index
        self.dispatcher = parts.dispatcher
        self.log = CommitLogReader(parts.commitlog)
        self._cleaner = Cleaner(parts, disk_usage_ratio, clock)
        self.archiver: Archiver | None = None
        if parts.archive is not None and config.archive is not None:
            self.archiver = Archiver(parts, config.archive, parts.archive)
            self._cleaner.archive_floor = self.archiver.floor
        self._lifecycle = StoreLifecycle(parts, self._cleaner, self.archiver)
        self._reader = StoreReader(parts)
        self.recovery: RecoveryReport | None = None
        self.set_asides = 0  # times ``restart_empty_at`` moved the data aside

    # ================================================================= lifecycle
    def open(self) -> MessageStore:
        self.recovery = self._lifecycle.open()
        return self

    def __enter__(self) -> MessageStore:
        return self.open() if not self._parts.open else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Graceful stop: flush and dispatch everything, checkpoint, remove the abort file."""
        self._lifecycle.close()

    # ================================================================= accessors
    @property
    def dispatched_offset(self) -> int:
        """Every record below it is in its ConsumeQueue and the index: readable."""
        return self._parts.dispatcher.offset

    @property
    def dispatched_store_timestamp_ms(self) -> int:
        """Store timestamp of the last record dispatched (0 before the first)."""
        return self._parts.dispatcher.last_store_timestamp_ms

    @property
    def failure(self) -> StoreFailure | None:
        """Why the store stopped writing for good (until restarted), or None while it has not."""
        return self._parts.failures.failure

    def on_failure(self, listener: FailureListener) -> None:
        """Call ``listener`` once when the store fails (at once if it has), from the thread that
        met the failure: a listener only hands it over (to an event loop, a queue)."""
        self._parts.failures.subscribe(listener)

    @property
    def dispatch_stalled(self) -> DiskFullError | None:
        """Set while dispatch waits for space on a full disk; appends are refused meanwhile."""
        return self._parts.dispatch_stall

    @property
    def page_stats(self) -> PageStats:
        """What the page settings did: how pages are warmed, mlock refusals, the transient
        store pool's buffers and commits (``pages.PageStats``)."""
        return self._parts.page_stats()

    @property
    def commitlog_flushes(self) -> int:
        """Flushes by the flusher thread that moved the flushed offset (under sync flush, the
        group commits); 0 before the store is opened."""
        flusher = self._lifecycle.flusher
        return flusher.flushes if flusher is not None else 0

    # ================================================================= writes
    def _check_writable(self) -> None:
        p = self._parts
        if not p.open:
            raise StoreClosedError(f"store {self.root} is closed")
        self._check_not_failed()
        if p.dispatch_stall is not None:
            raise DiskFullError(
                f"dispatch waits for disk space ({p.dispatch_stall}); writes resume when it "
                f"moves again"
            )
        if self._cleaner.disk_full:
            raise DiskFullError(
                f"disk usage above {self.config.disk_space_warning_level_ratio:.0%}; writes resume "
                f"when retention frees space"
            )

    def _check_not_failed(self) -> None:
        fatal = self._parts.fatal
        if fatal is None:
            return
        cls = DiskFailedError if isinstance(fatal, DiskFailedError) else StoreNotWritableError
        raise cls(f"store failed and refuses writes until restarted: {fatal}")

    def put_messages(self, messages: Sequence[Message]) -> PutResult:
        """Append a batch; all messages are validated before any byte is written."""
        if not messages:
            return PutResult([], done_future(PutStatus.PUT_OK))
        max_body = self.config.max_message_body_bytes
        results, _, durable, dispatched = self._append(lambda cl: cl.put(messages, max_body))
        return PutResult(results, durable, dispatched)

    def put_blocks(self, blocks: Sequence[SentBlock]) -> BlockPutResult:
        """Append producer-encoded blocks (``record.block``) as one write; every record of every
        block is checked before any byte is written (``CorruptBlockError`` and the other
        ``MessageIllegalError``s name the first bad one)."""
        max_body = self.config.max_message_body_bytes
        (placements, now), end, durable, dispatched = self._append(
            lambda cl: cl.put_blocks(blocks, max_body)
        )
        host = self._parts.commitlog.store_host
        return BlockPutResult(placements, now, host, end, durable, dispatched)

    def _append(
        self, put: Callable[[CommitLog], T]
    ) -> tuple[T, int, Future[PutStatus], Future[None]]:
        """Run ``put`` under the put lock, then hand the new end to the flusher (SYNC) or the
        dispatcher (ASYNC): (put's answer, the log's end, durable, dispatched)."""
        cl = self._parts.commitlog
        with self._parts.put_lock:
            self._check_writable()
            if cl.last_write_raw:
                self._require_aligned_tail()
            try:
                answer = put(cl)
            except OSError as e:
                raise self._parts.disk_failed("CommitLog write", e) from e
            end = cl.max_offset
            dispatched = self._parts.dispatch_waiters.wait_for(end, self._parts.dispatcher.offset)
        durable = self._lifecycle.durable(end)
        return answer, end, durable, dispatched

    def put_message(self, message: Message) -> PutResult:
        return self.put_messages([message])

    def _require_aligned_tail(self) -> None:
        p = self._parts
        with p.dispatch_lock:
            p.dispatch_step()
        if p.dispatcher.offset != p.commitlog.max_offset:
            raise TailNotAlignedError(
                f"the log ends inside a replicated record at {p.dispatcher.offset}; truncate "
                f"to a record boundary before appending locally"
            )

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        """Append replicated CommitLog bytes; returns the new end of the log."""
        p = self._parts
        with p.put_lock:
            if not p.open:
                raise StoreClosedError(f"store {self.root} is closed")
            self._check_not_failed()
            try:
                end = p.commitlog.append_raw(offset, data)
            except OSError as e:
                raise p.disk_failed("CommitLog write (replicated bytes)", e) from e
        self._lifecycle.wake_dispatch()
        return end

    def flush_commitlog(self) -> int:
        """Make every CommitLog byte appended so far durable now, in the caller's thread; returns
        the flushed offset (a slave that acknowledges only what it has synced). A failed flush
        stops the store accepting writes, as one of the flusher thread's does."""
        p = self._parts
        try:
            flushed = p.flush_commitlog(0)
        except DiskFailedError as e:
            raise p.fail(DISK_IO, e).error from None
        self._lifecycle.wake_dispatch()  # under sync flush, dispatch waits for the flush
        return flushed

    def truncate_to(self, offset: int, reason: str) -> int:
        """Cut the log back to ``offset`` (a record boundary at or below the end), keeping the cut
        bytes as evidence; ConsumeQueues and index follow. Returns the bytes cut."""
        p = self._parts
        with p.put_lock, p.dispatch_lock:
            cl = p.commitlog
            if not cl.min_offset <= offset <= cl.max_offset:
                raise StoreError(
                    f"cannot truncate to {offset}: log spans [{cl.min_offset}, {cl.max_offset}]"
                )
            if offset > p.dispatcher.offset:
                p.dispatch_step()
            if offset > p.dispatcher.offset:
                raise StoreError(f"{offset} is past the last whole record {p.dispatcher.offset}")
            evidence = EvidenceWriter(self.root, "commitlog", reason)
            truncate_log(cl, p.queues, p.index, p.dispatcher, offset, evidence, exact=True)
            p.write_checkpoint()
            p.write_manifest(force=True)
            return evidence.total

    def cut_partial_tail(self, reason: str) -> int:
        """Make a log that took replicated bytes ready for local appends: a record half-received
        when the stream stopped is cut (kept as evidence). Returns the bytes cut; the caller must
        have stopped raw appends."""
        p = self._parts
        p.flush_commitlog(0)  # under sync flush, dispatch stops at the flushed offset
        self.dispatch_now()
        end = p.dispatcher.offset
        if end >= p.commitlog.max_offset or p.dispatcher.error is not None:
            return 0
        return self.truncate_to(end, reason)

    def set_warm_ahead(self, ahead_bytes: int) -> None:
        """Warm the CommitLog ``ahead_bytes`` ahead of its writes from now on, 0 not at all
        (``StoreConfig.warm_ahead_bytes`` is where a store starts). A replica catching up turns
        it on while it is far behind: the warming thread then takes the first touch of each
        new page off the appending thread, on a core the catch-up leaves idle."""
        if ahead_bytes < 0:
            raise ValueError("ahead_bytes must be >= 0")
        if self._parts.open:
            self._lifecycle.set_warm_ahead(ahead_bytes)

    # ================================================================= dispatch
    def dispatch_now(self) -> int:
        """Dispatch whatever is ready, in the caller's thread (tools, tests, benchmarks)."""
        with self._parts.dispatch_lock:
            return self._parts.dispatch_step()

    @contextlib.contextmanager
    def dispatch_held(self) -> Iterator[None]:
        """Keep the dispatch thread (and the checkpoint, retention and truncation, which take the
        same lock) waiting while the block runs; ``dispatch_now`` in the block still works. For
        benchmarks and tests that measure or stage appends and dispatch apart."""
        p = self._parts
        with p.dispatch_lock:
            p.dispatch_holds += 1
            try:
                yield
            finally:
                p.dispatch_holds -= 1

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        self._parts.dispatcher.listeners.append(listener)

    def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Block until every record below ``offset`` is dispatched (tests and shutdown paths)."""
        dispatcher = self._parts.dispatcher
        deadline = time.monotonic() + timeout_s
        while dispatcher.offset < offset:
            if time.monotonic() > deadline:
                return False
            self._lifecycle.wake_dispatch()
            time.sleep(0.001)
        return True

    # ================================================================= retention
    def run_retention(self, *, now_s: float | None = None, manual: bool = False) -> int:
        """One retention pass (RocketMQ's CleanCommitLogService); returns files deleted."""
        return self._cleaner.run(now_s=now_s, manual=manual)

    def set_retention_floors(
        self,
        *,
        replicas: Callable[[], int | None] | None = None,
        consumers: Callable[[], Iterable[QueuePosition]] | None = None,
        pinned: Callable[[], Iterable[QueuePosition]] | None = None,
    ) -> None:
        """What retention must keep (``retention.py``): ``replicas`` is the CommitLog offset every
        in-sync slave holds (None: no slave to wait for); ``consumers`` the committed position
        of every group, as (topic, queue id, next queue offset); ``pinned`` the positions of
        state still pending in the log (the record at each, and everything after it, is kept
        whatever its age; a position at its queue's end pins nothing). Called by retention
        passes, in the store's housekeeping thread."""
        self._cleaner.replica_floor = replicas
        self._cleaner.consumer_positions = consumers
        self._cleaner.pinned_positions = pinned

    def set_archive_policy(
        self,
        *,
        enabled: Callable[[], bool],
        topic_policy: Callable[[str], str | None],
        safe_offset: Callable[[], int | None],
        owner: str = "",
    ) -> None:
        """How this store archives (docs/archive.md), when it has an archive: ``enabled`` says
        whether it archives now (a master) or only follows the manifest (a slave);
        ``topic_policy`` a topic's own retention policy, ``archive`` or ``delete`` (None: the
        archive's default); ``safe_offset`` the CommitLog offset every in-sync slave holds
        (None: none to wait for): nothing past it is archived, failover could cut it;
        ``owner`` the broker group (an archive of another group is refused)."""
        if self.archiver is not None:
            self.archiver.enabled = enabled
            self.archiver.topic_policy = topic_policy
            self.archiver.safe_offset = safe_offset
            self.archiver.claim(owner)

    def run_archive(self) -> int:
        """One archiving pass now (the archiver thread runs them every ``interval_ms``)."""
        return self.archiver.run() if self.archiver is not None else 0

    @property
    def retention_counts(self) -> RetentionCounts:
        """Files retention kept for a floor or deleted unconsumed, since the store opened."""
        return self._cleaner.counts

    def restart_empty_at(self, offset: int, extra: Sequence[str] = ()) -> str:
        """Move the store's data (and the root-relative ``extra`` names) aside, never deleting
        it, and continue empty with the log starting at ``offset``; returns where the data went
        (``set_aside.py``). A slave behind its master's retention resynchronises this way."""
        aside = restart_empty_at(self._parts, offset, extra)
        self.set_asides += 1
        return aside

    # ================================================================= reads (see reads.py)
    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._reader.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's max offset as consumers see it (only published entries count)."""
        return self._reader.max_offset(topic, queue_id)

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
        """Messages of one queue from ``offset`` (``StoreReader.get_messages`` says which)."""
        return self._reader.get_messages(
            topic, queue_id, offset, max_count, max_bytes, tags, max_commitlog_offset
        )

    def get_records(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tags: Sequence[str] | None = None,
        max_commitlog_offset: int | None = None,
    ) -> RecordsResult:
        """``get_messages``' records as their stored bytes, back to back, for a consumer that
        decodes them itself (``StoreReader.get_records``)."""
        return self._reader.get_records(
            topic, queue_id, offset, max_count, max_bytes, tags, max_commitlog_offset
        )

    def queue_entries(
        self, topic: str, queue_id: int, offset: int, max_count: int
    ) -> list[QueueEntry]:
        """ConsumeQueue entries without their records (``StoreReader.queue_entries``)."""
        return self._reader.queue_entries(topic, queue_id, offset, max_count)

    def look_message(self, phy_offset: int) -> StoredMessage:
        return self._reader.look_message(phy_offset)

    def get_message_by_id(self, msg_id: str) -> StoredMessage:
        return self._reader.get_message_by_id(msg_id)

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        max_num: int = 32,
        max_bytes: int | None = None,
    ) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (``StoreReader.query_by_key`` says which)."""
        return self._reader.query_by_key(topic, key, begin_ms, end_ms, max_num, max_bytes)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``."""
        return self._reader.offset_by_time(topic, queue_id, timestamp_ms)

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        return self._parts.commitlog.read_raw(offset, max_bytes)

    def stats(self) -> StoreStats:
        p = self._parts
        cl = p.commitlog
        return StoreStats(
            commitlog_min_offset=cl.min_offset,
            commitlog_max_offset=cl.max_offset,
            flushed_offset=cl.mfq.flushed_offset,
            dispatched_offset=p.dispatcher.offset,
            disk_usage_ratio=self._cleaner.disk_usage(),
            writable=p.open
            and p.fatal is None
            and p.dispatch_stall is None
            and not self._cleaner.disk_full,
            queues=len(p.queues.queues),
            recovery=self.recovery,
        )

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(key for key, _ in self._parts.queues.items()):
            out.setdefault(topic, []).append(qid)
        return out


__all__ = ["MessageStore", "PutResult", "StoreStats"]
