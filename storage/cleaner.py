"""The retention pass (RocketMQ's CleanCommitLogService, spec §6.3): the I/O side of retention.
``retention`` decides from the disk usage, the hour, the files' ages and the floors; this
measures the disk, keeps the disk-full flag that refuses writes, reads the floors, deletes the
chosen CommitLog files with the ConsumeQueue and index files that only pointed into them, and
logs and counts every file a floor held back or a forced pass deleted unconsumed.

The floors come from outside the store (storage knows nothing of slaves or consumer groups): the
broker sets ``replica_floor`` (a CommitLog offset every in-sync slave holds) and
``consumer_positions`` (each group's committed queue offset) and ``pinned_positions`` (the oldest
queue offset of each kind of state the broker keeps pending in a system topic: undelivered
timers, open transactions), both mapped here to CommitLog offsets through the ConsumeQueue."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tidemq.storage.consume_queue import is_blank
from tidemq.storage.mapped_file import offset_to_name
from tidemq.storage.parts import StoreParts
from tidemq.storage.retention import FileFacts, Held, RetentionDecision, decide, plan_deletions

log = logging.getLogger(__name__)

# (topic, queue id, next queue offset to consume): one consumer group's committed position.
QueuePosition = tuple[str, int, int]


@dataclass
class RetentionCounts:
    """What retention did that an operator must know about, counted since the store opened."""

    # Unexpired files a forced pass deleted although a consumer group had not read them.
    unconsumed_deleted: int = 0
    # Files a pass wanted to delete and kept, by ``Held`` reason (each file counted once).
    held: dict[Held, int] = field(default_factory=lambda: dict.fromkeys(Held, 0))


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
        self.replica_floor: Callable[[], int | None] | None = None
        self.consumer_positions: Callable[[], Iterable[QueuePosition]] | None = None
        self.pinned_positions: Callable[[], Iterable[QueuePosition]] | None = None
        # Set when the store archives (``archive.archiver``): files end at or below it to go.
        self.archive_floor: Callable[[], int] | None = None
        self.counts = RetentionCounts()
        self._last_held: tuple[int, Held] | None = None  # logged and counted once per file

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
        # Read outside the store's locks: they come from the broker's state.
        replica_floor, positions, pinned = self._read_floors()
        with p.put_lock, p.dispatch_lock:
            files = p.commitlog.mfq.files
            # Never delete what is not dispatched yet: its queue entries do not exist.
            eligible = [f for f in files[:-1] if f.end_offset <= p.dispatcher.offset]
            facts = [FileFacts(f.base_offset, f.end_offset, f.mtime()) for f in eligible]
            plan = plan_deletions(
                facts,
                now,
                cfg.file_reserved_time_hours * 3600,
                force=decision.force,
                batch_max=cfg.delete_file_batch_max,
                replica_floor=replica_floor,
                consumer_floor=self._lowest_record(positions) if decision.force else None,
                force_delete_unconsumed=cfg.force_delete_unconsumed,
                pinned_floor=self._lowest_record(pinned),
                archive_floor=self.archive_floor() if self.archive_floor is not None else None,
            )
            n = plan.delete
            if n:
                p.commitlog.mfq.delete_head(n)
                cl_min = p.commitlog.min_offset
                p.queues.delete_expired(cl_min)
                if p.index is not None:
                    p.index.delete_files_below(cl_min)
        self._report(plan.unconsumed, plan.held, replica_floor, usage)
        if n == 0:
            return 0
        p.write_manifest(force=True)
        log.info("retention deleted %d CommitLog file(s); min offset now %d", n, cl_min)
        return n

    def _read_floors(self) -> tuple[int | None, list[QueuePosition], list[QueuePosition]]:
        """The floors as the broker sees them now. One that cannot be read holds everything: a
        pass that deletes nothing is safe, one that deletes what a slave needs is not."""
        replica: int | None = None
        positions: list[QueuePosition] = []
        pinned: list[QueuePosition] = []
        try:
            if self.replica_floor is not None:
                replica = self.replica_floor()
            if self.consumer_positions is not None:
                positions = list(self.consumer_positions())
            if self.pinned_positions is not None:
                pinned = list(self.pinned_positions())
        except Exception:
            log.exception("retention floor unreadable; this pass deletes nothing")
            return 0, [], []
        return replica, positions, pinned

    def _lowest_record(self, positions: Iterable[QueuePosition]) -> int | None:
        """The lowest CommitLog offset of the records at these queue positions: for a group, the
        record at its committed queue offset (or at the queue's minimum, if retention already
        went past it); for pinned state, its oldest pending record. A position at or past its
        queue's end, or on a queue that does not exist, holds nothing back. Call under the
        dispatch lock (the queues do not move)."""
        floor: int | None = None
        queues = self._parts.queues
        for topic, queue_id, offset in positions:
            cq = queues.get(topic, queue_id)
            if cq is None or offset >= cq.max_offset:
                continue
            for phy, size, _tag in cq.read(max(offset, cq.min_offset), 64):
                if not is_blank(phy, size):
                    floor = phy if floor is None else min(floor, phy)
                    break
        return floor

    def _report(
        self,
        unconsumed: Iterable[FileFacts],
        held: tuple[FileFacts, Held] | None,
        replica_floor: int | None,
        usage: float,
    ) -> None:
        for f in unconsumed:
            self.counts.unconsumed_deleted += 1
            log.warning(
                "retention deleted unconsumed CommitLog file %s [%d, %d) at disk usage %.1f%% "
                "(force_delete_unconsumed): a consumer group had not read all of it",
                offset_to_name(f.base_offset),
                f.base_offset,
                f.end_offset,
                usage * 100,
            )
        if held is None:
            return
        f, why = held
        if self._last_held == (f.base_offset, why):
            return  # passes in between that held nothing (not forced, nothing expired) do not count
        self._last_held = (f.base_offset, why)
        self.counts.held[why] += 1
        if why is Held.UNREPLICATED:
            detail = f"an in-sync slave has acknowledged only up to {replica_floor}"
        elif why is Held.UNARCHIVED:
            detail = (
                "it is not archived yet (retention policy archive; an unreachable archive stops "
                "deletion until it is back)"
            )
        elif why is Held.PINNED:
            detail = (
                "it holds state the broker still has pending (an undelivered delayed message or "
                "an open transaction)"
            )
        else:
            detail = (
                "a consumer group has not read all of it (force_delete_unconsumed is off: writes "
                "are refused when the disk fills)"
            )
        log.warning(
            "retention kept CommitLog file %s [%d, %d) at disk usage %.1f%%: %s",
            offset_to_name(f.base_offset),
            f.base_offset,
            f.end_offset,
            usage * 100,
            detail,
        )
