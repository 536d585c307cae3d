"""What the storage benchmark's cases share (not run directly): the workload of 1 KiB messages,
the store configuration, the goals, and the JSON-lines output (``emit``) with its statistics.

``store_bench.py`` runs as ``python bench/store_bench.py``, so this directory is first on
``sys.path`` and the case modules import this one as ``store_common``; it puts the checkout the
benchmark lives in ahead of any installed tidemq.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tidemq.storage import FlushMode, Message, StoreConfig  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
BATCH = 256
BODY_BYTES = 1024
# Goals of the issue.
GOAL_APPEND_VS_CEILING = 0.5
GOAL_DISPATCH_MSGS_PER_S = 200_000
GOAL_RECOVERY_S_PER_GIB = 10.0
# "Flat": anonymous memory may grow by at most this much between 25% and 100% of the data.
GOAL_ANON_GROWTH_KIB = 16 * 1024
KINDS = ("plain", "keyed")
KIND_DOC = {
    "plain": "TAGS only",
    "keyed": "TAGS + one KEYS value + a 32-hex-digit UNIQ_KEY (what RocketMQ clients send)",
}
# RocketMQ's UNIQ_KEY: 20 hex digits of ip/pid/loader, then 12 of time and counter.
UNIQ_PREFIX = f"7F000001{os.getpid() & 0xFFFF:04X}{int.from_bytes(os.urandom(4), 'big'):08X}"

Record = dict[str, Any]


# ===================================================================== output helpers
def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def emit(name: str, **kv: Any) -> Record:
    """One machine-readable result line on stdout (perfkit's format, without the prefix)."""
    rec: Record = {"bench": name, "load1": loadavg()[0], **_round(kv)}
    print(json.dumps(rec), flush=True)
    return rec


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def pct(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile, p in [0, 100] (as perfkit's common.pct)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(p / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def mem_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of this process in KiB (ru_maxrss as fallback)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[key + "_kib"] = int(value.split()[0])
    except OSError:
        pass
    if "VmRSS_kib" not in out:
        out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


def medians(runs: Sequence[Record], keys: Sequence[str]) -> Record:
    return {
        k: median([r[k] for r in runs]) for k in keys if all(r.get(k) is not None for r in runs)
    }


# ===================================================================== workload
def store_config(root: str, file_bytes: int, mode: FlushMode) -> StoreConfig:
    return StoreConfig(
        root,
        commitlog_file_size_bytes=file_bytes,
        flush_mode=mode,
        message_index_enable=True,
    )


class Workload:
    """Batches of 1 KiB messages. Plain batches are one list reused; keyed ones are built per
    batch since every message has its own keys."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.body = os.urandom(BODY_BYTES)
        self.plain = [
            Message(TOPIC, self.body, queue_id=j % QUEUES, tags="TagA") for j in range(BATCH)
        ]

    def batch(self, start: int, count: int) -> list[Message]:
        if self.kind == "plain":
            return self.plain[:count]
        body = self.body
        return [
            Message(
                TOPIC,
                body,
                queue_id=i % QUEUES,
                tags="TagA",
                keys=[f"order-{i}"],
                properties={"UNIQ_KEY": f"{UNIQ_PREFIX}{i:012X}"},
            )
            for i in range(start, start + count)
        ]


def n_messages(gib: float) -> int:
    return int(gib * (1 << 30)) // BODY_BYTES


def config_fields(cfg: StoreConfig) -> Record:
    """The store configuration the figures were measured with (JSON-able fields only)."""
    out: Record = {}
    for f in dataclasses.fields(cfg):
        if not f.init:
            continue  # derived (e.g. the packed store host)
        v = getattr(cfg, f.name, None)
        if isinstance(v, enum.Enum):
            v = v.value
        if isinstance(v, str | int | float | bool | tuple):
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def git_state() -> Record:
    """HEAD and the uncommitted files under storage/: the tree is edited while we measure."""

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(
                ["git", "-C", REPO, *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return p.stdout.rstrip("\n") if p.returncode == 0 else None

    dirty = git("status", "--porcelain", "--", "storage")
    return {
        "head": (git("rev-parse", "--short", "HEAD") or "").strip() or None,
        "storage_uncommitted": sorted(x[3:] for x in dirty.splitlines()) if dirty else [],
    }
