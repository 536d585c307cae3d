"""Retention decisions (RocketMQ's CleanCommitLogService, spec §6.3) as pure functions: no files,
no clock, so the rules are tested as a table.

``decide`` says whether a pass runs and whether it is forced (disk usage); ``plan_deletions``
says which of the oldest CommitLog files go. Three floors hold files back, all CommitLog offsets
(a file is held when it ends above the floor):

- the **replica floor**, the lowest offset an in-sync slave has acknowledged: no pass, expired or
  forced, deletes a byte a slave still needs, so a slave's copy never has a hole;
- the **consumer floor**, the lowest offset a consumer group has not consumed yet: only a forced
  pass (the disk filling before files expire) looks at it. Expired files go whatever consumers
  did (RocketMQ's rule); an unexpired file a group has not read goes only under
  ``force_delete_unconsumed``, otherwise it is kept and the disk fills until writes are refused;
- the **archive floor**, the end of the oldest files that all have an archive manifest entry,
  when the store archives: no pass, expired or forced, deletes a file that is not archived yet
  (or recorded as not wanted by any topic's policy), so an archive that cannot be reached stops
  deletion and loses nothing;
- the **pinned floor**, the lowest offset of state the broker still has pending in the log (a
  delayed message not yet delivered, an open transaction's half): no pass, expired or forced,
  deletes it, whatever its age, because that state exists nowhere else.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tidemq.storage.config import StoreConfig


@dataclass(frozen=True)
class RetentionDecision:
    delete: bool  # run a deletion pass now
    force: bool  # delete even files that have not expired
    disk_full: bool  # refuse writes until usage drops


def decide(
    cfg: StoreConfig, usage_ratio: float, hour: int, manual: bool = False
) -> RetentionDecision:
    disk_full = usage_ratio > cfg.disk_space_warning_level_ratio
    force = usage_ratio > cfg.disk_space_clean_forcibly_ratio
    delete = (
        manual
        or force
        or usage_ratio > cfg.disk_max_used_space_ratio
        or hour in cfg.delete_when_hours
    )
    return RetentionDecision(delete=delete, force=force, disk_full=disk_full)


@dataclass(frozen=True, slots=True)
class FileFacts:
    """One CommitLog file as retention sees it."""

    base_offset: int
    end_offset: int
    mtime_s: float


class Held(enum.Enum):
    """Why a file retention wanted to delete was kept (the metric's ``reason`` label)."""

    UNREPLICATED = "unreplicated"  # an in-sync slave has not acknowledged all of it
    UNCONSUMED = "unconsumed"  # forced, not expired, and a consumer group has not read it all
    PINNED = "pinned"  # holds pending broker state (an undelivered timer, an open transaction)
    UNARCHIVED = "unarchived"  # the store archives and this file is not archived yet


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    delete: int  # how many of the oldest files go
    # Of those, the unexpired ones a consumer group had not read (force_delete_unconsumed).
    unconsumed: tuple[FileFacts, ...] = ()
    # The file the pass stopped at because a floor held it, and which floor; None when the pass
    # stopped for another reason (not expired and not forced, the batch limit, no more files).
    held: tuple[FileFacts, Held] | None = None


def plan_deletions(
    files: Sequence[FileFacts],
    now_s: float,
    reserved_s: float,
    *,
    force: bool,
    batch_max: int,
    replica_floor: int | None = None,
    consumer_floor: int | None = None,
    force_delete_unconsumed: bool = False,
    pinned_floor: int | None = None,
    archive_floor: int | None = None,
) -> RetentionPlan:
    """Which of ``files`` (oldest first; the caller left out the newest and anything not
    dispatched) to delete. Only a prefix can go: the pass stops at the first file it keeps."""
    unconsumed: list[FileFacts] = []
    n = 0
    for f in files:
        if n >= batch_max:
            break
        expired = f.mtime_s + reserved_s <= now_s
        floors = (
            (replica_floor, Held.UNREPLICATED),
            (pinned_floor, Held.PINNED),
            (archive_floor, Held.UNARCHIVED),
        )
        for floor, why in floors:
            if floor is not None and f.end_offset > floor:
                held = (f, why) if expired or force else None
                return RetentionPlan(n, tuple(unconsumed), held)
        if not expired:
            if not force:
                break
            if consumer_floor is not None and f.end_offset > consumer_floor:
                if not force_delete_unconsumed:
                    return RetentionPlan(n, tuple(unconsumed), (f, Held.UNCONSUMED))
                unconsumed.append(f)
        n += 1
    return RetentionPlan(n, tuple(unconsumed))
