"""Opening and closing a store, and the threads that run it while it is open.

Threads: callers append under one put lock (a single appender at a time); ``commitlog-flush``
flushes (and serves group commits); ``flush-watcher`` times out sync flushes; ``dispatch`` builds
ConsumeQueue and index entries; ``housekeeping`` flushes queues, writes the checkpoint and runs
retention; ``commitlog-warm`` brings the pages ahead of the writer into the page cache. Nothing
here uses asyncio: the broker wraps the returned futures.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.checkpoint import read_checkpoint
from tidemq.storage.cleaner import Cleaner
from tidemq.storage.config import FlushMode
from tidemq.storage.errors import CorruptRecordError, StoreError
from tidemq.storage.flush import FlushService
from tidemq.storage.lock import StoreLock
from tidemq.storage.manifest import check_layout
from tidemq.storage.parts import StoreParts
from tidemq.storage.recovery import RecoveryReport, recover
from tidemq.storage.warm import PageWarmer

log = logging.getLogger(__name__)

DISPATCH_SLICE_RECORDS = 1024


class StoreLifecycle:
    def __init__(self, parts: StoreParts, cleaner: Cleaner) -> None:
        self._parts = parts
        self._cleaner = cleaner
        self.lock = StoreLock(parts.root)
        self._dispatch_cond = threading.Condition()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.flusher: FlushService | None = None
        self.warmer: PageWarmer | None = None

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
            p.write_checkpoint()
            p.write_manifest()
            with open(abort, "w") as f:
                f.write(f"{os.getpid()}\n")
            fsync_dir(root)
            self._start_services()
        except BaseException:
            p.close_files()
            self.lock.release()
            raise
        p.open = True
        return report

    def _start_services(self) -> None:
        cfg = self._parts.config
        flusher = FlushService(
            self._parts.flush_commitlog,
            sync=cfg.flush_mode is FlushMode.SYNC,
            interval_ms=cfg.flush_interval_ms,
            least_pages=cfg.flush_least_pages,
            thorough_interval_ms=cfg.flush_thorough_interval_ms,
            sync_timeout_ms=cfg.sync_flush_timeout_ms,
            on_flushed=lambda _off: self.wake_dispatch(),
            on_error=self._on_fatal,
            flushed_offset=self._parts.commitlog.mfq.flushed_offset,
        )
        self.flusher = flusher
        flusher.start()
        if cfg.warm_ahead_bytes:
            mfq = self._parts.commitlog.mfq
            self.warmer = PageWarmer(lambda: mfq.last_file, ahead_bytes=cfg.warm_ahead_bytes)
            self.warmer.start()
        self.threads = [
            threading.Thread(target=self._dispatch_loop, name="dispatch", daemon=True),
            threading.Thread(target=self._housekeeping_loop, name="housekeeping", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def close(self) -> None:
        """Graceful stop: flush and dispatch everything, checkpoint, remove the abort file."""
        p = self._parts
        if not p.open:
            return
        with p.put_lock:
            p.open = False
        assert self.flusher is not None
        self.flusher.stop()
        if self.warmer is not None:
            self.warmer.stop()
        self.stop_event.set()
        self.wake_dispatch()
        for t in self.threads:
            t.join()
        clean = False
        if p.fatal is None:
            with p.dispatch_lock:
                p.dispatch_step()
            p.queues.flush()
            if p.index is not None:
                p.index.flush()
            p.write_checkpoint()
            p.write_manifest()
            clean = p.dispatcher.offset >= p.commitlog.max_offset and not p.dispatcher.error
        if clean:
            # Only a store with nothing left to dispatch may skip abnormal recovery next time.
            os.unlink(os.path.join(p.root, "abort"))
            fsync_dir(p.root)
        p.close_files()
        self.lock.release()

    def _on_fatal(self, exc: BaseException) -> None:
        self._parts.fatal = exc

    # ================================================================= dispatch
    def wake_dispatch(self) -> None:
        with self._dispatch_cond:
            self._dispatch_cond.notify_all()

    def _dispatch_loop(self) -> None:
        p = self._parts
        dispatcher = p.dispatcher
        while not self.stop_event.is_set():
            with self._dispatch_cond:
                if dispatcher.offset >= p.dispatch_end() or dispatcher.error:
                    self._dispatch_cond.wait(0.5)
            try:
                # Bounded slices: the checkpoint, retention and truncation take this lock too, and
                # must not wait behind a whole backlog.
                with p.dispatch_lock:
                    p.dispatch_step(DISPATCH_SLICE_RECORDS)
            except StoreError as e:
                if dispatcher.error is None:
                    log.exception("dispatch stopped")
                dispatcher.error = CorruptRecordError(dispatcher.offset, str(e))
            except Exception as e:  # a broken dispatcher must stop writes, loudly
                log.exception("dispatch failed; the store stops accepting writes")
                p.fatal = e
                dispatcher.error = CorruptRecordError(dispatcher.offset, repr(e))

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
            except Exception as e:
                log.exception("housekeeping failed; the store stops accepting writes")
                p.fatal = e
