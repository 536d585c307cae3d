"""Retention decisions (RocketMQ's CleanCommitLogService, spec §6.3) as pure functions: no files,
no clock, so the rules are tested as a table."""

from __future__ import annotations

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


def expired_file_count(
    mtimes: Sequence[float], now_s: float, reserved_s: float, *, force: bool, batch_max: int
) -> int:
    """How many of the oldest files (oldest first, the caller already left out the newest) to
    delete: stop at the first one that has not expired, unless forced; at most ``batch_max``."""
    n = 0
    for mtime in mtimes:
        if n >= batch_max or (not force and mtime + reserved_s > now_s):
            break
        n += 1
    return n
