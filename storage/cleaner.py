"""The retention pass (RocketMQ's CleanCommitLogService, spec §6.3): the I/O side of retention.
``retention`` decides from the disk usage and the hour; this measures the disk, keeps the
disk-full flag that refuses writes, and deletes expired CommitLog files with the ConsumeQueue and
index files that only pointed into them."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable

from tidemq.storage.parts import StoreParts
from tidemq.storage.retention import RetentionDecision, decide, expired_file_count

log = logging.getLogger(__name__)


class Cleaner:
    def __init__(
        self,
        parts: StoreParts,
        disk_usage_ratio: Callable[[], float] | None,
        clock: Callable[[], float],
    ) -> None:
        self._parts = parts
        self.disk_usage = disk_usage_ratio or self._measure_disk_usage
        self._clock = clock
        # Above the warning level writes are refused until a pass sees usage drop.
        self.disk_full = False

    def _measure_disk_usage(self) -> float:
        u = shutil.disk_usage(self._parts.root)
        return u.used / u.total if u.total else 0.0

    def run(self, *, now_s: float | None = None, manual: bool = False) -> int:
        """One retention pass (RocketMQ's CleanCommitLogService); returns files deleted."""
        p = self._parts
        cfg = p.config
        now = self._clock() if now_s is None else now_s
        usage = self.disk_usage()
        decision: RetentionDecision = decide(cfg, usage, time.localtime(now).tm_hour, manual)
        if decision.disk_full != self.disk_full:
            log.warning(
                "disk usage %.1f%%: writes %s",
                usage * 100,
                "refused" if decision.disk_full else "accepted again",
            )
            self.disk_full = decision.disk_full
        if not decision.delete:
            return 0
        with p.put_lock, p.dispatch_lock:
            files = p.commitlog.mfq.files
            # Never delete what is not dispatched yet: its queue entries do not exist.
            eligible = [f for f in files[:-1] if f.end_offset <= p.dispatcher.offset]
            n = expired_file_count(
                [f.mtime() for f in eligible],
                now,
                cfg.file_reserved_time_hours * 3600,
                force=decision.force,
                batch_max=cfg.delete_file_batch_max,
            )
            if n == 0:
                return 0
            p.commitlog.mfq.delete_head(n)
            cl_min = p.commitlog.min_offset
            for cq in p.queues.all():
                cq.delete_expired(cl_min)
            if p.index is not None:
                p.index.delete_files_below(cl_min)
        p.write_manifest(force=True)
        log.info("retention deleted %d CommitLog file(s); min offset now %d", n, cl_min)
        return n
