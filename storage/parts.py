"""The parts of one store and the locks that keep them consistent, shared by the modules
``MessageStore`` is built from (lifecycle, reads, the retention pass, truncation), with the few
steps several of them take: flush the CommitLog, dispatch, write the checkpoint and the manifest.

Locks: ``put_lock`` admits one appender at a time (retention and truncation take it too);
``dispatch_lock`` is held around every dispatch step and by whatever must not interleave with one
(the checkpoint, retention, truncation); ``flush_lock`` serialises CommitLog flushes.
"""

from __future__ import annotations

import os
import threading

from tidemq.storage.archive.backends import open_backend
from tidemq.storage.archive.reader import ArchiveReader
from tidemq.storage.checkpoint import Checkpoint, write_checkpoint
from tidemq.storage.commitlog import CommitLog
from tidemq.storage.config import FlushMode, StoreConfig
from tidemq.storage.dispatch import Dispatcher
from tidemq.storage.dispatch_waiters import DispatchWaiters
from tidemq.storage.errors import DiskFullError
from tidemq.storage.failure import DISK_IO, FailureSignal, StoreFailure, disk_error
from tidemq.storage.index_service import IndexService
from tidemq.storage.manifest import Manifest
from tidemq.storage.pages import POPULATE, PageCounters, PageStats
from tidemq.storage.queue_store import ConsumeQueueStore
from tidemq.storage.transient_pool import TransientStorePool


class StoreParts:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.root = config.root_dir
        self.commitlog = CommitLog(
            self.root, config.commitlog_file_size_bytes, config.store_host_packed, config.record_crc
        )
        self.page_counters = PageCounters()
        # The pool's buffers are made when the store opens (``lifecycle``), not here.
        self.pool = (
            TransientStorePool(
                config.transient_store_pool_buffers,
                config.commitlog_file_size_bytes,
                self.page_counters,
            )
            if config.transient_store_pool_enable
            else None
        )
        self.commitlog.mfq.configure(
            pool=self.pool,
            populate_new=config.warm_mapped_file,
            lock_active=config.mlock_commitlog,
            counters=self.page_counters,
        )
        commitlog = self.commitlog
        self.queues = ConsumeQueueStore(
            self.root,
            config.consume_queue_entries_per_file,
            config.consume_queue_max_open_files,
            lambda: commitlog.min_offset,
        )
        commitlog.queue_offset_source = self.queues.next_queue_offset
        commitlog.reset_queue_table()
        self.index: IndexService | None = (
            IndexService(
                os.path.join(self.root, "index"), config.index_slot_num, config.index_max_num
            )
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(self.commitlog, self.queues, self.index)
        self.manifest = Manifest(self.root)
        # Reads past local retention (docs/archive.md); the archiver is the store's.
        self.archive: ArchiveReader | None = None
        if config.archive is not None:
            self.archive = ArchiveReader(
                open_backend(config.archive.uri, config.archive.s3_endpoint_url or None),
                cache_bytes=config.archive.cache_bytes,
                record_crc=config.record_crc,
            )
        self.put_lock = threading.Lock()
        # Re-entrant: truncation holds it while writing the checkpoint, which takes it too.
        self.dispatch_lock = threading.RLock()
        # ``dispatch_held`` blocks open: puts leave their records undispatched meanwhile (the
        # lock alone would not stop a put in the holding thread, it is re-entrant).
        self.dispatch_holds = 0
        self.flush_lock = threading.Lock()
        self.open = False
        # What stopped the store accepting writes (a failed flush, dispatch or housekeeping).
        self.fatal: BaseException | None = None
        self.failures = FailureSignal()
        self.dispatch_waiters = DispatchWaiters()
        # Set while dispatch waits for space on a full disk (appends are refused meanwhile).
        self.dispatch_stall: DiskFullError | None = None

    def fail(self, reason: str, exc: BaseException) -> StoreFailure:
        """The store stops writing for good (until restarted): ``fatal`` is set, whoever waits
        for dispatch is answered with the error, the listeners are told."""
        failure = self.failures.fail(reason, exc)
        self.fatal = failure.error
        self.dispatch_waiters.fail_for_good(failure.error)
        return failure

    def flush_commitlog(self, least_pages: int) -> int:
        with self.flush_lock:
            try:
                return self.commitlog.flush(least_pages)
            except OSError as e:
                # The disk lost writes it had accepted: what it holds is unknown from here on.
                raise disk_error("CommitLog flush (fdatasync)", e) from e

    def commit_commitlog(self, least_pages: int) -> int:
        """Copy what the pool's write buffers hold into the CommitLog files (a no-op without a
        pool); returns the committed offset."""
        try:
            return self.commitlog.mfq.commit(least_pages)
        except OSError as e:
            raise disk_error("CommitLog commit (pwrite)", e) from e

    def disk_failed(self, what: str, exc: OSError) -> BaseException:
        """Fail the store for an I/O error of ``what``; returns the typed error to raise."""
        return self.fail(DISK_IO, disk_error(what, exc)).error

    def dispatch_end(self) -> int:
        """How far dispatch may go: what is committed (readers never see bytes that are only
        in a write buffer), and under SYNC flush only what is durable."""
        mfq = self.commitlog.mfq
        readable = mfq.committed_offset if self.pool is not None else mfq.max_offset
        if self.config.flush_mode is FlushMode.SYNC:
            return min(mfq.flushed_offset, readable)
        return readable

    def dispatch_step(self, max_records: int | None = None) -> int:
        count = self.dispatcher.dispatch(self.dispatch_end(), max_records=max_records)
        self.dispatch_waiters.advance(self.dispatcher.offset)
        return count

    def write_checkpoint(self) -> None:
        """Make everything below the dispatched offset durable, then record that offset."""
        with self.dispatch_lock:
            d = self.dispatcher.offset
            logics_ts = self.dispatcher.last_store_timestamp_ms
        if self.commitlog.mfq.flushed_offset < d:
            self.flush_commitlog(0)
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

    def write_manifest(self, *, force: bool = False) -> None:
        # A store not open (yet, or any more) always writes it: at open and at shutdown.
        self.manifest.write(self.queues, self.index, force=force or not self.open)

    def close_files(self) -> None:
        self.commitlog.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()

    def close_pool(self) -> None:
        """Free the pool's buffers; after ``close_files``, which has every file give its back."""
        if self.pool is not None:
            self.pool.close()

    def page_stats(self) -> PageStats:
        pool = self.pool
        cfg = self.config
        warming = "madvise" if POPULATE.supported else "preadv"
        if not cfg.warm_ahead_bytes and not cfg.warm_mapped_file:
            warming = "off"
        return PageStats(
            warming=warming,
            mlock_failures=self.page_counters.mlock_failures,
            mlock_error=self.page_counters.mlock_error,
            pool_buffers=0 if pool is None else pool.made,
            pool_free=0 if pool is None else pool.free,
            pool_misses=0 if pool is None else pool.misses,
            commits=self.commitlog.mfq.commits,
        )
