"""Storage benchmark cases 4 and 5: ``recovery`` (a child process fills a store and SIGKILLs
itself; a second child times the reopen with the checkpoint, a third after deleting the
checkpoint: full CRC scan + re-dispatch) and ``memory`` (RSS of the filling child at
0/25/50/75/100%). The children are ``store_bench.py --child-fill`` and ``--child-open``. Part of
``store_bench.py``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from store_common import (
    BATCH,
    GOAL_ANON_GROWTH_KIB,
    KIND_DOC,
    Record,
    Workload,
    emit,
    log,
    median,
    medians,
    mem_status,
    n_messages,
    store_config,
)

from tidemq.storage import FlushMode, MessageStore
from tidemq.storage.checkpoint import checkpoint_path, read_checkpoint

# The children run the benchmark's own script.
BENCH_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store_bench.py")


def child_fill(root: str, gib: float, file_bytes: int, kind: str) -> None:
    """Child process: fill a store with background dispatch running, then SIGKILL itself."""
    n = n_messages(gib)
    wl = Workload(kind)
    s = MessageStore(store_config(root, file_bytes, FlushMode.ASYNC)).open()
    print(json.dumps({"child": "mem", "pct": 0, **mem_status()}), flush=True)
    marks = [n * q // 4 for q in (1, 2, 3, 4)]
    done = 0
    put_wall = 0.0
    t0 = time.perf_counter()
    while done < n:
        k = min(BATCH, n - done)
        batch = wl.batch(done, k)
        t = time.perf_counter()
        s.put_messages(batch)
        put_wall += time.perf_counter() - t
        done += k
        while marks and done >= marks[0]:
            pct_done = 100 * marks[0] // n if n else 100
            print(json.dumps({"child": "mem", "pct": pct_done, **mem_status()}), flush=True)
            marks.pop(0)
    wall = time.perf_counter() - t0
    fill = {
        "child": "fill",
        "msgs": n,
        "log_bytes": s.log.max_offset,
        "dispatched_offset_at_kill": s.dispatched_offset,
        "append_msgs_per_s_with_bg_dispatch": n / put_wall,
        "fill_wall_s": wall,
    }
    print(json.dumps(fill), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def child_open(root: str, file_bytes: int) -> None:
    """Child process: time the reopen (recovery) of a crashed store, then SIGKILL itself."""
    t = time.perf_counter()
    s = MessageStore(store_config(root, file_bytes, FlushMode.ASYNC)).open()
    open_s = time.perf_counter() - t
    rep = dataclasses.asdict(s.recovery) if s.recovery is not None else {}
    out = {
        "child": "open",
        "open_s": open_s,
        "recovery": rep,
        "max_offset": s.log.max_offset,
        "dispatched_offset": s.dispatched_offset,
        **mem_status(),
    }
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def run_child(args: Sequence[str], timeout_s: float = 900.0) -> tuple[int, list[Record]]:
    cmd = [sys.executable, BENCH_SCRIPT, *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout_s, check=False)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, lines


def recovery_run(root: str, gib: float, file_bytes: int, kind: str) -> Record:
    common = ["--file-bytes", str(file_bytes)]
    rc, lines = run_child(["--child-fill", root, "--gib", str(gib), "--kind", kind, *common])
    fill = next((x for x in lines if x.get("child") == "fill"), None)
    if rc != -signal.SIGKILL or fill is None:
        raise RuntimeError(f"fill child ended with {rc}, output {lines}")
    mem = [x for x in lines if x.get("child") == "mem"]
    abort_left = os.path.exists(os.path.join(root, "abort"))
    cp = read_checkpoint(root)
    cp_offset = cp.recovery_offset if cp is not None else None

    opens: dict[str, Record] = {}
    for label in ("with_checkpoint", "full_scan"):
        if label == "full_scan":
            os.unlink(checkpoint_path(root))
        rc, lines = run_child(["--child-open", root, *common])
        res = next((x for x in lines if x.get("child") == "open"), None)
        if rc != -signal.SIGKILL or res is None:
            raise RuntimeError(f"open child ({label}) ended with {rc}, output {lines}")
        if res["dispatched_offset"] != fill["log_bytes"] or res["max_offset"] != fill["log_bytes"]:
            raise RuntimeError(f"recovery ({label}) did not restore the log: {res}")
        opens[label] = res

    def fields(r: Record) -> Record:
        rep = r["recovery"]
        return {
            "open_s": r["open_s"],
            "recover_s": rep.get("seconds"),
            "abnormal": rep.get("abnormal"),
            "checkpoint_found": rep.get("checkpoint_found"),
            "scan_from": rep.get("scan_from"),
            "records_scanned": rep.get("records_scanned"),
            "records_redispatched": rep.get("records_redispatched"),
            "full_redispatch": rep.get("full_redispatch"),
            "index_helper": rep.get("index_helper"),
            "index_helper_failure": rep.get("index_helper_failure"),
            "cut_bytes": rep.get("cut_bytes"),
            "VmHWM_kib": r.get("VmHWM_kib"),
        }

    wc, fs = fields(opens["with_checkpoint"]), fields(opens["full_scan"])
    return {
        "kind": kind,
        "msgs": fill["msgs"],
        "log_bytes": fill["log_bytes"],
        "abort_file_left_by_kill": abort_left,
        "checkpoint_recovery_offset_at_kill": cp_offset,
        "dispatched_offset_at_kill": fill["dispatched_offset_at_kill"],
        "dispatch_lag_bytes_at_kill": fill["log_bytes"] - fill["dispatched_offset_at_kill"],
        "checkpoint_lag_bytes_at_kill": (
            fill["dispatched_offset_at_kill"] - cp_offset if cp_offset is not None else None
        ),
        "append_msgs_per_s_with_bg_dispatch": fill["append_msgs_per_s_with_bg_dispatch"],
        "recovery_s_with_checkpoint": wc["open_s"],
        "recovery_s_full_scan": fs["open_s"],
        "with_checkpoint": wc,
        "full_scan": fs,
        "memory": mem,
    }


def anon_growth_kib(mem: Sequence[Record]) -> int | None:
    by = {m["pct"]: m for m in mem}
    if 25 not in by or 100 not in by or "RssAnon_kib" not in by[100]:
        return None
    return int(by[100]["RssAnon_kib"] - by[25]["RssAnon_kib"])


def run_recovery(
    a: argparse.Namespace,
    gib: float,
    n: int,
    runs: int,
    file_bytes: int,
    fresh: Callable[[str], str],
) -> tuple[list[Record], Record, list[int]]:
    """Crash, recovery and memory: the runs, each emitted, then the medians and the memory
    growth; returns the runs, the recovery medians and the growth of each run."""
    recs: list[Record] = []
    rruns = max(1, a.recovery_runs if a.recovery_runs is not None else min(runs, 2))
    for i in range(rruns):
        log(
            f"recovery: run {i + 1}/{rruns}, fill {gib} GiB ({a.recovery_kind}) in a child, SIGKILL"
        )
        root = fresh("recovery")
        r = recovery_run(root, gib, file_bytes, a.recovery_kind)
        shutil.rmtree(root, ignore_errors=True)
        recs.append(r)
        emit("recovery.run", run=i + 1, **r)
    rec_keys = ["recovery_s_with_checkpoint", "recovery_s_full_scan"]
    rec = medians(recs, rec_keys)
    name = f"recovery_abnormal_{gib:g}GiB"
    emit(
        name,
        kind=a.recovery_kind,
        messages=KIND_DOC[a.recovery_kind],
        msgs=n,
        log_bytes=recs[0]["log_bytes"],
        runs=rruns,
        timing="wall time of MessageStore(config).open() in a fresh child process",
        page_cache="warm (the data was just written; no cache drop)",
        recovery_s_with_checkpoint_runs=[r["recovery_s_with_checkpoint"] for r in recs],
        recovery_s_full_scan_runs=[r["recovery_s_full_scan"] for r in recs],
        with_checkpoint=recs[0]["with_checkpoint"],
        full_scan=recs[0]["full_scan"],
        append_msgs_per_s_with_bg_dispatch=median(
            [r["append_msgs_per_s_with_bg_dispatch"] for r in recs]
        ),
        **rec,
    )
    growths = [g for g in (anon_growth_kib(r["memory"]) for r in recs) if g is not None]
    emit(
        "memory",
        process="the filling child (ASYNC, background dispatch running)",
        runs=rruns,
        samples=recs[0]["memory"],
        rss_anon_growth_25_to_100_kib_runs=growths,
        rss_anon_growth_25_to_100_kib=median(growths) if growths else None,
        flat_threshold_kib=GOAL_ANON_GROWTH_KIB,
        note="RssFile grows with the mapped CommitLog/ConsumeQueue/index pages by design",
    )
    return recs, rec, growths
