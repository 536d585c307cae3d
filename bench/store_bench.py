"""Storage benchmark of tidemq's MessageStore, next to the perfkit mmap ceiling of this machine.

usage: python bench/store_bench.py --perfkit ../shared/perfkit [--gib 1] [--runs 3] [--quick]

Prints one JSON object per line on stdout, ``{"bench": name, "load1": ..., ...}`` like perfkit's
``emit``, progress on stderr, and last a ``{"bench": "summary", ...}`` line with the ratios and
one boolean per goal of the issue: append >= 50% of the perfkit pack+crc32 ceiling, dispatch
>= 200k msgs/s, recovery of 1 GiB <= 10 s, anonymous memory flat while the store grows.

Every message has a 1 KiB body; every figure is the median of ``--runs`` runs, except sections 4
and 5, which refill a store per run and so default to min(runs, 2) runs (``--recovery-runs``) to
keep the default invocation within about 10 minutes on the 2-core machine.

1. ``append_async``: ASYNC flush, batches of 256 messages, ``--gib`` of bodies, wall time of the
   ``put_messages`` calls only (building the batches is the caller's work and is not counted).
   The background dispatch is held off meanwhile (see ``append_dispatch_run``).
2. ``durable_group_commit``: SYNC flush, 64 threads each putting one message and waiting for it
   to be durable, for a fixed time; msgs/s, latency percentiles and the number of msync groups.
3. ``dispatch``: after section 1, the time to dispatch the whole backlog (ConsumeQueue + index),
   once with tags only and once with one key and a UNIQ_KEY per message.
4. ``recovery``: a child process fills a store and SIGKILLs itself; a second child times the
   reopen with the checkpoint, a third after deleting the checkpoint (full CRC scan + re-dispatch).
5. ``memory``: RSS of the filling child at 0/25/50/75/100% (RssAnon is the one that must stay flat:
   CommitLog, ConsumeQueue and index pages are shared file pages and show up in RssFile).
6. ``ceiling``: perfkit's ``mmap_append.py`` with the same size, runs and environment.

Each case is a module beside this script: ``store_append`` (1 and 3), ``store_durable`` (2),
``store_recovery`` (4 and 5, with the child processes this script runs for them) and
``store_ceiling`` (6); ``store_common`` holds the workload, the goals and the output helpers.

The scratch directory (``$TMPDIR`` or /tmp, ``tidemq-bench-*``) is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

from store_append import run_append_dispatch
from store_ceiling import ceiling
from store_common import (
    BATCH,
    BODY_BYTES,
    GOAL_ANON_GROWTH_KIB,
    GOAL_APPEND_VS_CEILING,
    GOAL_DISPATCH_MSGS_PER_S,
    GOAL_RECOVERY_S_PER_GIB,
    KINDS,
    QUEUES,
    REPO,
    Record,
    config_fields,
    emit,
    git_state,
    loadavg,
    log,
    median,
    n_messages,
    store_config,
)
from store_durable import run_durable
from store_recovery import child_fill, child_open, run_recovery

from tidemq.storage import FlushMode


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    ap.add_argument("--gib", type=float, default=None, help="GiB of 1 KiB bodies (default 1)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 128 MiB, short durable part")
    ap.add_argument("--file-mib", type=int, default=1024, help="CommitLog file size")
    ap.add_argument("--durable-s", type=float, default=None, help="durable part per run (5 s)")
    ap.add_argument("--recovery-kind", choices=KINDS, default="keyed")
    ap.add_argument(
        "--recovery-runs",
        type=int,
        default=None,
        help="crash/recovery/memory runs (default min(runs, 2): each one refills the store)",
    )
    ap.add_argument("--skip-ceiling", action="store_true")
    ap.add_argument(
        "--profile", action="store_true", help="one extra cProfile'd append+dispatch (stderr)"
    )
    ap.add_argument("--child-fill", help=argparse.SUPPRESS)
    ap.add_argument("--child-open", help=argparse.SUPPRESS)
    ap.add_argument("--file-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=KINDS, default="keyed", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    gib = a.gib if a.gib is not None else (0.125 if a.quick else 1.0)
    file_bytes = a.file_bytes or a.file_mib << 20
    if a.child_fill:
        child_fill(a.child_fill, gib, file_bytes, a.kind)
        return 1  # not reached: the child kills itself
    if a.child_open:
        child_open(a.child_open, file_bytes)
        return 1

    runs = max(1, a.runs)
    durable_s = a.durable_s if a.durable_s is not None else (2.0 if a.quick else 5.0)
    n = n_messages(gib)
    base = os.environ.get("TMPDIR") or "/tmp"
    scratch = tempfile.mkdtemp(prefix="tidemq-bench-", dir=base)
    try:
        started = time.perf_counter()
        load_start = loadavg()
        free = shutil.disk_usage(scratch).free
        emit(
            "config",
            gib=gib,
            msgs=n,
            body_bytes=BODY_BYTES,
            batch=BATCH,
            queues=QUEUES,
            runs=runs,
            commitlog_file_bytes=file_bytes,
            scratch=scratch,
            scratch_free_gib=free / (1 << 30),
            python=sys.version.split()[0],
            cpus=os.cpu_count(),
            loadavg=load_start,
            git=git_state(),
            store_config=config_fields(store_config(scratch, file_bytes, FlushMode.ASYNC)),
            malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        )
        return _run(a, gib, n, runs, durable_s, file_bytes, scratch, started, load_start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(
    a: argparse.Namespace,
    gib: float,
    n: int,
    runs: int,
    durable_s: float,
    file_bytes: int,
    scratch: str,
    started: float,
    load_start: list[float],
) -> int:
    def fresh(name: str) -> str:
        path = os.path.join(scratch, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    # 6. The ceiling first, so it runs in the same minutes as the append it is compared with.
    ceil: Record | None = None
    if not a.skip_ceiling:
        log(f"ceiling: {a.perfkit}/mmap_append.py --gib {gib} --runs {runs}")
        ceil = ceiling(a.perfkit, gib, runs, scratch)
        if ceil is not None:
            emit("ceiling.mmap_append", **ceil)

    # 1 + 3. Append, then dispatch, alternating the kinds inside each run.
    per_kind, agg = run_append_dispatch(a, n, runs, file_bytes, fresh)
    # 2. Durable group commit.
    _, dur = run_durable(runs, durable_s, file_bytes, fresh)
    # 4 + 5. Crash, recovery and memory.
    recs, rec, growths = run_recovery(a, gib, n, runs, file_bytes, fresh)
    rruns = len(recs)

    # Summary.
    load_end = loadavg()
    app_rate = agg["plain"].get("append_msgs_per_s")
    c_cold = ceil.get("pack_crc32_cold_recs_per_s") if ceil else None
    c_warm = ceil.get("pack_crc32_warm_recs_per_s") if ceil else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    def at_least(x: float | None, y: float) -> bool | None:
        return x >= y if x is not None else None

    r_cold, r_warm = ratio(app_rate, c_cold), ratio(app_rate, c_warm)
    recovery_goal_s = GOAL_RECOVERY_S_PER_GIB * gib
    growth = median(growths) if growths else None
    emit(
        "summary",
        gib=gib,
        runs=runs,
        append_msgs_per_s=app_rate,
        append_MBps_bodies=agg["plain"].get("append_MBps_bodies"),
        append_cpu_us_per_msg=agg["plain"].get("append_cpu_us_per_msg"),
        append_keyed_msgs_per_s=agg["keyed"].get("append_msgs_per_s"),
        ceiling_pack_crc32_cold_recs_per_s=c_cold,
        ceiling_pack_crc32_warm_recs_per_s=c_warm,
        store_record_bytes_avg=per_kind["plain"][0]["log_bytes"] / n,
        ceiling_record_bytes=1024,
        ratio_append_vs_ceiling_cold=r_cold,
        ratio_append_vs_ceiling_warm=r_warm,
        dispatch_msgs_per_s=agg["plain"].get("dispatch_msgs_per_s"),
        dispatch_keyed_msgs_per_s=agg["keyed"].get("dispatch_msgs_per_s"),
        durable_msgs_per_s=dur.get("msgs_per_s"),
        durable_p50_ms=dur.get("p50_ms"),
        durable_p99_ms=dur.get("p99_ms"),
        durable_msgs_per_group=dur.get("msgs_per_group"),
        recovery_s_with_checkpoint=rec.get("recovery_s_with_checkpoint"),
        recovery_s_full_scan=rec.get("recovery_s_full_scan"),
        recovery_goal_s=recovery_goal_s,
        recovery_runs=rruns,
        append_keyed_msgs_per_s_with_bg_dispatch=median(
            [r["append_msgs_per_s_with_bg_dispatch"] for r in recs]
        ),
        dispatch_lag_bytes_at_kill=median([r["dispatch_lag_bytes_at_kill"] for r in recs]),
        rss_anon_growth_25_to_100_kib=growth,
        # The store's pages are first-touch pages, like the ceiling's cold pass: that is the
        # like-for-like ratio; the warm pass is the upper bound.
        goal_append_ge_50pct_ceiling_cold=at_least(r_cold, GOAL_APPEND_VS_CEILING),
        goal_append_ge_50pct_ceiling_warm=at_least(r_warm, GOAL_APPEND_VS_CEILING),
        goal_dispatch_ge_200k=at_least(
            agg["plain"].get("dispatch_msgs_per_s"), GOAL_DISPATCH_MSGS_PER_S
        ),
        goal_dispatch_keyed_ge_200k=at_least(
            agg["keyed"].get("dispatch_msgs_per_s"), GOAL_DISPATCH_MSGS_PER_S
        ),
        goal_recovery_full_scan_le_10s_per_gib=(
            rec["recovery_s_full_scan"] <= recovery_goal_s
            if "recovery_s_full_scan" in rec
            else None
        ),
        goal_recovery_with_checkpoint_le_10s_per_gib=(
            rec["recovery_s_with_checkpoint"] <= recovery_goal_s
            if "recovery_s_with_checkpoint" in rec
            else None
        ),
        goal_memory_flat=growth <= GOAL_ANON_GROWTH_KIB if growth is not None else None,
        loadavg_start=load_start,
        loadavg_end=load_end,
        git_end=git_state(),
        elapsed_s=time.perf_counter() - started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
