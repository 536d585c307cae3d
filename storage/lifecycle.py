"""Opening and closing a store, and the threads that run it while it is open.

Threads: callers append under one put lock (a single appender at a time); ``commitlog-flush``
flushes (and serves group commits); ``flush-watcher`` times out sync flushes; ``dispatch`` builds
ConsumeQueue and index entries; ``housekeeping`` flushes queues, writes the checkpoint and runs
retention; ``commitlog-warm`` brings the pages ahead of the writer into the page cache;
``commitlog-commit``, with a transient store pool, copies appended bytes from the write buffers
into the files. Nothing here uses asyncio: the broker wraps the returned futures.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from concurrent.futures import Future

from tidemq.storage.answers import done_future
from tidemq.storage.archive.archiver import Archiver
from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.checkpoint import read_checkpoint
from tidemq.storage.cleaner import Cleaner
from tidemq.storage.config import FlushMode
from tidemq.storage.errors import (
    CorruptRecordError,
    DiskFailedError,
    DiskFullError,
    StoreClosedError,
    StoreError,
    StoreNotWritableError,
)
from tidemq.storage.failure import DISK_IO, DISPATCH, FLUSH, HOUSEKEEPING
from tidemq.storage.flush import CommitService, FlushService
from tidemq.storage.lock import StoreLock
from tidemq.storage.manifest import check_layout
from tidemq.storage.parts import StoreParts
from tidemq.storage.recovery import RecoveryReport, recover
from tidemq.storage.results import PutStatus
from tidemq.storage.warm import PageWarmer

log = logging.getLogger(__name__)
ARCHIVE_STOP_WAIT_S = 2.0

DISPATCH_SLICE_RECORDS = 1024
# A put dispatches its own records, in the appending thread, when dispatch has no more than
# this behind it (``dispatch_inline``); a larger backlog is the dispatch thread's.
INLINE_DISPATCH_MAX_BYTES = 1 << 20
# Dispatch on a full disk tries again after a pause that doubles up to the maximum.
DISK_FULL_RETRY_MIN_S = 0.05
DISK_FULL_RETRY_MAX_S = 1.0


class StoreLifecycle:
    def __init__(
        self, parts: StoreParts, cleaner: Cleaner, archiver: Archiver | None = None
    ) -> None:
        self._archiver = archiver
        self.archive_thread: threading.Thread | None = None
        self._parts = parts
        self._cleaner = cleaner
        self.lock = StoreLock(parts.root)
        self._dispatch_cond = threading.Condition()
        self.stop_event = threading.Event()
        if archiver is not None:
            archiver.stopping = self.stop_event.is_set
        self.threads: list[threading.Thread] = []
        self.flusher: FlushService | None = None
        self.warmer: PageWarmer | None = None
        self.committer: CommitService | None = None

    # ================================================================= open / close
    def open(self) -> RecoveryReport:
        """Lock the directory, recover, and start the threads; returns what recovery did."""
        p = self._parts
        root = p.root
        os.makedirs(root, exist_ok=True)
        self.lock.acquire()
        try:
            check_layout(root, p.config)
            abort = os.path.join(root, "abort")
            abnormal = os.path.exists(abort)
            p.commitlog.mfq.load()
            p.queues.load()
            if p.index is not None:
                p.index.load()
            manifest, index_end = p.manifest.read()
            report = recover(
                p.commitlog,
                p.queues,
                p.index,
                p.dispatcher,
                read_checkpoint(root),
                abnormal=abnormal,
                root_dir=root,
                truncate_on_corruption=p.config.truncate_on_corruption,
                manifest=manifest,
                index_end_expected=index_end,
                index_helper_min_bytes=p.config.recovery_index_helper_min_bytes,
                lock_fd=self.lock.fileno(),
            )
            log.info("store %s recovered: %s", root, report)
            last = p.commitlog.mfq.last_file
            if last is not None and not last.is_full:
                last.advise_appending(True)  # recovery read it with readahead; appends follow
            p.write_checkpoint()
            p.write_manifest()
            with open(abort, "w") as f:
                f.write(f"{os.getpid()}\n")
            fsync_dir(root)
            self._start_services()
        except BaseException:
            self._stop_services()
            p.close_files()
            p.close_pool()
            self.lock.release()
            raise
        p.open = True
        return report

    def _start_services(self) -> None:
        cfg = self._parts.config
        mfq = self._parts.commitlog.mfq
        pool = self._parts.pool
        if pool is not None:
            pool.init()
        mfq.prepare_tail()
        if pool is not None:
            self.committer = CommitService(
                self._parts.commit_commitlog,
                lambda: mfq.max_offset,
                interval_ms=cfg.commit_interval_ms,
                least_pages=cfg.commit_least_pages,
                on_committed=lambda _off: self.wake_dispatch(),
                on_error=self._on_flush_failed,
                committed_offset=mfq.committed_offset,
            )
            self.committer.start()
        flusher = FlushService(
            self._parts.flush_commitlog,
            sync=cfg.flush_mode is FlushMode.SYNC,
            interval_ms=cfg.flush_interval_ms,
            least_pages=cfg.flush_least_pages,
            thorough_interval_ms=cfg.flush_thorough_interval_ms,
            sync_timeout_ms=cfg.sync_flush_timeout_ms,
            on_flushed=lambda _off: self.wake_dispatch(),
            on_error=self._on_flush_failed,
            flushed_offset=self._parts.commitlog.mfq.flushed_offset,
        )
        self.flusher = flusher
        flusher.start()
        if cfg.warm_ahead_bytes:
            self.set_warm_ahead(cfg.warm_ahead_bytes)
        self.threads = [
            threading.Thread(target=self._dispatch_loop, name="dispatch", daemon=True),
            threading.Thread(target=self._housekeeping_loop, name="housekeeping", daemon=True),
        ]
        for t in self.threads:
            t.start()
        if self._archiver is not None:
            # Not among ``threads``: close does not wait for an upload (it resumes next time).
            self.archive_thread = threading.Thread(
                target=self._archive_loop, name="archiver", daemon=True
            )
            self.archive_thread.start()

    def close(self) -> None:
        """Graceful stop: flush and dispatch everything, checkpoint, remove the abort file."""
        p = self._parts
        if not p.open:
            return
        with p.put_lock:
            p.open = False
        self._stop_services()
        self.stop_event.set()
        self.wake_dispatch()
        for t in self.threads:
            t.join()
        if self.archive_thread is not None:
            # An upload in progress goes on reading its own mapping; it is resumed at the next
            # start if the process ends first. A pass between uploads notices the stop at once.
            self.archive_thread.join(ARCHIVE_STOP_WAIT_S)
        clean = False
        if p.fatal is None:
            try:
                with p.dispatch_lock:
                    p.dispatch_step()
                p.queues.flush()
                if p.index is not None:
                    p.index.flush()
                p.write_checkpoint()
                p.write_manifest()
            except (StoreError, OSError) as e:
                # A full disk: recovery at the next start dispatches what is missing.
                log.warning("closing: dispatch or checkpoint did not finish (%s)", e)
            else:
                clean = p.dispatcher.offset >= p.commitlog.max_offset and not p.dispatcher.error
        if clean:
            # Only a store with nothing left to dispatch may skip abnormal recovery next time.
            os.unlink(os.path.join(p.root, "abort"))
            fsync_dir(p.root)
        p.dispatch_waiters.fail_for_good(StoreClosedError(f"store {p.root} closed"))
        p.close_files()
        p.close_pool()
        self.lock.release()

    def _stop_services(self) -> None:
        """Stop the CommitLog's threads: the commit service commits everything appended, then
        the flusher flushes it; a thread never started is skipped."""
        if self.committer is not None:
            self.committer.stop()
        if self.flusher is not None:
            self.flusher.stop()
        if self.warmer is not None:
            self.warmer.stop()

    def set_warm_ahead(self, ahead_bytes: int) -> None:
        """Warm the CommitLog this far ahead of its writes from now on (0: not at all); the
        warming thread starts the first time it is asked for."""
        if self.warmer is None:
            if not ahead_bytes:
                return
            mfq = self._parts.commitlog.mfq
            self.warmer = PageWarmer(lambda: mfq.last_file, ahead_bytes=ahead_bytes)
            self.warmer.start()
        self.warmer.set_ahead(ahead_bytes)

    def durable(self, end: int) -> Future[PutStatus]:
        """The durable future of a put whose records end at ``end``: after the group commit's
        flush under SYNC flush; under ASYNC at once, or with a transient store pool once the
        records are committed (copied into the file, which survives the process)."""
        if self._parts.config.flush_mode is FlushMode.SYNC:
            assert self.flusher is not None
            return self.flusher.submit(end)
        if self.committer is not None:
            return self.committer.submit(end)  # it wakes dispatch once the records are in
        if not self.dispatch_inline(end):
            self.wake_dispatch()
        return done_future(PutStatus.PUT_OK)

    def dispatch_inline(self, end: int) -> bool:
        """Dispatches up to ``end`` here, in the thread that appended, when dispatch is idle and
        at most ``INLINE_DISPATCH_MAX_BYTES`` behind; True when it got there.

        A sender's answer waits for dispatch. Handed to the dispatch thread, a small put's
        dispatch (a fraction of a millisecond of work) waited for the GIL at every step while
        the event loop ran other clients' calls: measured under one client's flood, a
        well-behaved client's sends waited up to 40 ms for their dispatch, against 0.3 ms
        done here. Whatever goes wrong is left to the dispatch thread, which retries the step
        and handles the failure (a full disk, a failed disk, a corrupt record)."""
        p = self._parts
        if p.dispatch_stall is not None or p.dispatcher.error is not None or p.dispatch_holds:
            return False
        if end - p.dispatcher.offset > INLINE_DISPATCH_MAX_BYTES:
            return False
        if not p.dispatch_lock.acquire(blocking=False):
            return False  # the dispatch thread (or a checkpoint) is at it
        try:
            p.dispatch_step(DISPATCH_SLICE_RECORDS)
        except Exception:  # the dispatch thread meets it again, and handles it
            log.debug("inline dispatch left to the dispatch thread", exc_info=True)
            return False
        finally:
            p.dispatch_lock.release()
        return p.dispatcher.offset >= end

    def _on_flush_failed(self, exc: BaseException) -> None:
        self._parts.fail(DISK_IO if isinstance(exc, DiskFailedError) else FLUSH, exc)

    # ================================================================= dispatch
    def wake_dispatch(self) -> None:
        with self._dispatch_cond:
            self._dispatch_cond.notify_all()

    def _dispatch_loop(self) -> None:
        p = self._parts
        dispatcher = p.dispatcher
        pause_s = 0.0  # > 0 while the disk is full: the next try waits this long
        while not self.stop_event.is_set():
            if pause_s:
                if self.stop_event.wait(pause_s):
                    break
            else:
                with self._dispatch_cond:
                    if dispatcher.offset >= p.dispatch_end() or dispatcher.error:
                        self._dispatch_cond.wait(0.5)
            try:
                # Bounded slices: the checkpoint, retention and truncation take this lock too, and
                # must not wait behind a whole backlog.
                with p.dispatch_lock:
                    p.dispatch_step(DISPATCH_SLICE_RECORDS)
            except DiskFullError as e:
                pause_s = self._stalled(e, pause_s)
                continue
            except OSError as e:
                if e.errno == errno.ENOSPC:  # a queue's directory, made before its first file
                    pause_s = self._stalled(DiskFullError(f"no space: {e}"), pause_s)
                    continue
                p.disk_failed("dispatch (ConsumeQueue or index write)", e)
                return
            except StoreNotWritableError as e:  # a file that could not be reserved: not space
                p.fail(DISK_IO, DiskFailedError(f"dispatch: {e}"))
                return
            except StoreError as e:
                if dispatcher.error is None:
                    log.exception("dispatch stopped")
                dispatcher.error = CorruptRecordError(dispatcher.offset, str(e))
            except Exception as e:  # noqa: BLE001 - a broken dispatcher must stop writes, loudly
                dispatcher.error = CorruptRecordError(dispatcher.offset, repr(e))
                p.fail(DISPATCH, e)
                return
            if dispatcher.error is not None and dispatcher.stopped_at is not None:
                # Nothing past a corrupt record becomes visible: its senders hear why.
                p.dispatch_waiters.fail_waiting(dispatcher.error)
            if pause_s:
                pause_s = 0.0
                p.dispatch_stall = None
                log.warning(
                    "dispatch resumed at CommitLog offset %d: disk space is back", dispatcher.offset
                )

    def _stalled(self, exc: DiskFullError, pause_s: float) -> float:
        """Dispatch cannot write a ConsumeQueue or index file: the disk is full. Appends are
        refused and whoever waits for dispatch is answered DISK_FULL, every try, until a try
        succeeds. Returns the pause before the next try."""
        p = self._parts
        p.dispatch_waiters.advance(p.dispatcher.offset)
        if p.dispatch_stall is None:
            log.error(
                "dispatch stopped at CommitLog offset %d: disk full (%s); appends are refused "
                "and dispatch retries until space returns",
                p.dispatcher.offset,
                exc,
            )
        p.dispatch_stall = exc
        p.dispatch_waiters.fail_waiting(
            DiskFullError(f"the message is stored but cannot be dispatched: disk full ({exc})")
        )
        return min(max(pause_s * 2, DISK_FULL_RETRY_MIN_S), DISK_FULL_RETRY_MAX_S)

    # ================================================================= archiving
    def _archive_loop(self) -> None:
        """Archiving runs in its own thread: uploading a 1 GiB file must not hold up the
        checkpoint. Its failures stop archiving (and deletion), never the store."""
        archiver = self._archiver
        assert archiver is not None
        period_s = archiver.config.interval_ms / 1000
        # First the manifest alone, at once: reads past retention wait for it (a retriable
        # ARCHIVE_UNAVAILABLE meanwhile), and an archive slow to answer must not hold up opening.
        try:
            archiver.read_manifest()
        except Exception:  # logged; the next pass reads it again
            log.exception("reading the archive's manifest failed; read again in %.1f s", period_s)
        while not self.stop_event.wait(period_s):
            try:
                archiver.run()
            except Exception:  # logged; the next pass tries again
                log.exception("archiving pass failed; tried again in %.1f s", period_s)

    # ================================================================= housekeeping
    def _housekeeping_loop(self) -> None:
        p = self._parts
        cfg = p.config
        period_s = min(cfg.checkpoint_interval_ms, cfg.consume_queue_flush_interval_ms) / 1000
        next_clean = time.monotonic() + cfg.clean_resource_interval_ms / 1000
        while not self.stop_event.wait(period_s):
            try:
                p.queues.flush(2)
                p.write_checkpoint()
                p.write_manifest()
                if time.monotonic() >= next_clean:
                    next_clean = time.monotonic() + cfg.clean_resource_interval_ms / 1000
                    self._cleaner.run()
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    # The checkpoint stays older (recovery replays a little more): not a failure.
                    log.warning("housekeeping: disk full (%s); retried next period", e)
                    continue
                p.disk_failed("housekeeping (queue flush or checkpoint)", e)
                return
            except DiskFailedError as e:
                p.fail(DISK_IO, e)
                return
            except Exception as e:  # noqa: BLE001 - the failure logs it and stops writes
                p.fail(HOUSEKEEPING, e)
                return
