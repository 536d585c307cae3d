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

The scratch directory (``$TMPDIR`` or /tmp, ``tidemq-bench-*``) is deleted at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import enum
import io
import json
import os
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tidemq.storage import FlushMode, Message, MessageStore, PutStatus, StoreConfig  # noqa: E402
from tidemq.storage.checkpoint import checkpoint_path, read_checkpoint  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
BATCH = 256
BODY_BYTES = 1024
DURABLE_THREADS = 64
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
                ["git", "-C", _REPO, *args],
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


# ===================================================================== 1 + 3: append, dispatch
def _profile_text(prof: cProfile.Profile, limit: int = 25) -> str:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(limit)
    return buf.getvalue()


def append_dispatch_run(
    root: str, kind: str, n: int, file_bytes: int, profile: bool = False
) -> Record:
    """Append ``n`` messages (ASYNC flush), then dispatch all of them; one fresh store."""
    wl = Workload(kind)
    s = MessageStore(store_config(root, file_bytes, FlushMode.ASYNC)).open()
    prof = cProfile.Profile() if profile else None
    marks = [n * q // 4 for q in (1, 2, 3, 4)]
    mem: list[Record] = []
    put_wall = put_cpu = 0.0
    done = 0
    try:
        # Why the lock: the store's own "dispatch" thread would otherwise dispatch concurrently
        # with the appends and take the GIL from them (2 cores, one GIL), so neither the append
        # rate nor the dispatch rate would be measured alone. ``_dispatch_lock`` is the lock
        # ``dispatch_now`` and the dispatch thread take around every dispatch step; holding it
        # parks that thread (and the checkpoint writer, which takes it too) until we let go. The
        # async CommitLog flusher keeps running, as it would in the broker. After the appends we
        # run, still under the lock and in this thread, exactly the step ``dispatch_now`` runs
        # (``dispatcher.dispatch(end)``; in ASYNC mode the end is the CommitLog's max offset), so
        # there is no window in which the background thread could take the work over and the
        # measured time is the dispatch of the whole backlog, nothing else.
        with s.dispatch_held():
            proc0 = time.process_time()
            wall0 = time.perf_counter()
            if prof is not None:
                prof.enable()
            while done < n:
                k = min(BATCH, n - done)
                batch = wl.batch(done, k)
                t = time.perf_counter()
                c = time.thread_time()
                s.put_messages(batch)
                put_cpu += time.thread_time() - c
                put_wall += time.perf_counter() - t
                done += k
                while marks and done >= marks[0]:
                    mem.append({"pct": 100 * marks[0] // n if n else 100, **mem_status()})
                    marks.pop(0)
            if prof is not None:
                prof.disable()
            total_wall = time.perf_counter() - wall0
            proc_cpu = time.process_time() - proc0
            end = s.commitlog.max_offset
            dispatched_at_append_end = s.dispatcher.offset

            dprof = cProfile.Profile() if profile else None
            t = time.perf_counter()
            c = time.thread_time()
            pc = time.process_time()
            if dprof is not None:
                dprof.enable()
            count = 0
            while s.dispatcher.offset < end:
                got = s.dispatcher.dispatch(end)
                count += got
                if got == 0 and s.dispatcher.offset < end:
                    raise RuntimeError(
                        f"dispatch stuck at {s.dispatcher.offset} < {end}: {s.dispatcher.error}"
                    )
            if dprof is not None:
                dprof.disable()
            d_wall = time.perf_counter() - t
            d_cpu = time.thread_time() - c
            d_proc_cpu = time.process_time() - pc
        t = time.perf_counter()
        s.close()
        close_s = time.perf_counter() - t
    finally:
        s.close()
    if prof is not None and dprof is not None:
        log(f"---- cProfile of append ({kind}), caller thread, top by tottime")
        log(_profile_text(prof))
        log(f"---- cProfile of dispatch ({kind}), caller thread, top by tottime")
        log(_profile_text(dprof))
    if count != n:
        raise RuntimeError(f"dispatched {count} records, appended {n}")
    return {
        "kind": kind,
        "msgs": n,
        "log_bytes": end,
        "append_msgs_per_s": n / put_wall,
        "append_MBps_bodies": n * BODY_BYTES / put_wall / 1e6,
        "append_MBps_log": end / put_wall / 1e6,
        "append_put_wall_s": put_wall,
        "append_total_wall_s": total_wall,
        "append_cpu_s": put_cpu,
        "append_cpu_us_per_msg": put_cpu / n * 1e6,
        "append_process_cpu_s": proc_cpu,
        "dispatched_offset_at_append_end": dispatched_at_append_end,
        "dispatch_msgs_per_s": n / d_wall,
        "dispatch_s": d_wall,
        "dispatch_cpu_s": d_cpu,
        "dispatch_cpu_us_per_msg": d_cpu / n * 1e6,
        "dispatch_process_cpu_s": d_proc_cpu,
        "close_s": close_s,
        "memory": mem,
    }


# ===================================================================== 2: durable group commit
def durable_run(root: str, duration_s: float, threads: int, file_bytes: int) -> Record:
    s = MessageStore(store_config(root, file_bytes, FlushMode.SYNC)).open()
    try:
        body = os.urandom(BODY_BYTES)
        # Warm-up: the first put creates (fallocates) the CommitLog file.
        s.put_messages([Message(TOPIC, body, tags="TagA")]).wait()

        # Count msync groups: flushes by the flusher thread that moved the flushed offset. The
        # store has no counter, so the instance's CommitLog.flush is wrapped (measurement only).
        cl = s.commitlog
        orig_flush = cl.flush
        groups = [0]

        def counting_flush(least_pages: int = 0) -> int:
            before = cl.mfq.flushed_offset
            after = orig_flush(least_pages)
            if after > before and threading.current_thread().name == "commitlog-flush":
                groups[0] += 1
            return after

        cl.flush = counting_flush  # type: ignore[method-assign]

        stop = threading.Event()
        barrier = threading.Barrier(threads + 1)
        lats: list[list[float]] = [[] for _ in range(threads)]
        not_ok = [0] * threads
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            msg = Message(TOPIC, body, queue_id=i % QUEUES, tags="TagA")
            mine = lats[i]
            barrier.wait()
            try:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    status = s.put_messages([msg]).wait()
                    mine.append(time.perf_counter() - t0)
                    if status is not PutStatus.PUT_OK:
                        not_ok[i] += 1
            except BaseException as e:  # noqa: BLE001 - reported, then the run fails
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for th in ts:
            th.start()
        barrier.wait()
        groups[0] = 0
        t0 = time.perf_counter()
        c0 = time.process_time()
        time.sleep(duration_s)
        stop.set()
        for th in ts:
            th.join()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        n_groups = groups[0]
        if errors:
            raise RuntimeError(f"durable writer failed: {errors[0]!r}")
    finally:
        s.close()
    all_lat = [x for lat in lats for x in lat]
    n = len(all_lat)
    return {
        "threads": threads,
        "msgs": n,
        "wall_s": wall,
        "msgs_per_s": n / wall,
        "p50_ms": pct(all_lat, 50) * 1e3,
        "p90_ms": pct(all_lat, 90) * 1e3,
        "p99_ms": pct(all_lat, 99) * 1e3,
        "max_ms": max(all_lat) * 1e3 if all_lat else float("nan"),
        "not_put_ok": sum(not_ok),
        "msync_groups": n_groups,
        "msgs_per_group": n / n_groups if n_groups else None,
        "process_cpu_us_per_msg": cpu / n * 1e6 if n else None,
    }


# ===================================================================== 4 + 5: recovery, memory
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
        "log_bytes": s.commitlog.max_offset,
        "dispatched_offset_at_kill": s.dispatcher.offset,
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
        "max_offset": s.commitlog.max_offset,
        "dispatched_offset": s.dispatcher.offset,
        **mem_status(),
    }
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def run_child(args: Sequence[str], timeout_s: float = 900.0) -> tuple[int, list[Record]]:
    cmd = [sys.executable, os.path.abspath(__file__), *args]
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


# ===================================================================== 6: ceiling
def ceiling(perfkit: str, gib: float, runs: int, scratch: str) -> Record | None:
    perfkit = os.path.abspath(perfkit)
    script = os.path.join(perfkit, "mmap_append.py")
    if not os.path.exists(script):
        log(f"no {script}: the ceiling is skipped")
        return None
    env = dict(os.environ)
    env.setdefault("PERFKIT_TMP", os.path.join(scratch, "perfkit"))  # same filesystem as ours
    cmd = [sys.executable, script, "--gib", str(gib), "--runs", str(runs)]
    t = time.perf_counter()
    p = subprocess.run(
        cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=perfkit, timeout=1800, check=False
    )
    wall = time.perf_counter() - t
    out: Record = {"script": script, "args": cmd[2:], "wall_s": wall, "returncode": p.returncode}
    for line in p.stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[len("RESULT ") :])
        if r.get("bench") == "mmap.append_1KiB" and r.get("mode") == "pack+crc32":
            out[f"pack_crc32_{r['pass_']}_recs_per_s"] = r["recs_per_s"]
            out[f"pack_crc32_{r['pass_']}_recs_per_s_runs"] = r["recs_per_s_runs"]
            out[f"pack_crc32_{r['pass_']}_load1"] = r.get("load1")
        elif r.get("bench") == "mmap.append_1KiB":
            out[f"{r['mode']}_{r['pass_']}_recs_per_s"] = r["recs_per_s"]
    if "pack_crc32_cold_recs_per_s" not in out:
        log(f"ceiling: no pack+crc32 result (rc {p.returncode})")
    return out


# ===================================================================== main
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--perfkit", default=os.path.join(_REPO, "..", "shared", "perfkit"))
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
    per_kind: dict[str, list[Record]] = {k: [] for k in KINDS}
    for i in range(runs):
        for kind in KINDS:
            log(f"append+dispatch {kind}: run {i + 1}/{runs}, {n} msgs")
            root = fresh(f"append-{kind}")
            r = append_dispatch_run(root, kind, n, file_bytes)
            shutil.rmtree(root, ignore_errors=True)
            per_kind[kind].append(r)
            emit("append_dispatch.run", run=i + 1, **r)
    append_keys = [
        "append_msgs_per_s",
        "append_MBps_bodies",
        "append_MBps_log",
        "append_cpu_s",
        "append_cpu_us_per_msg",
        "append_process_cpu_s",
        "append_put_wall_s",
    ]
    dispatch_keys = [
        "dispatch_msgs_per_s",
        "dispatch_s",
        "dispatch_cpu_s",
        "dispatch_cpu_us_per_msg",
    ]
    agg: dict[str, Record] = {}
    for kind in KINDS:
        rs = per_kind[kind]
        app = medians(rs, append_keys)
        name = "append_async" if kind == "plain" else "append_async_keyed"
        emit(
            name,
            kind=kind,
            messages=KIND_DOC[kind],
            msgs=n,
            log_bytes=rs[0]["log_bytes"],
            runs=runs,
            append_msgs_per_s_runs=[round(r["append_msgs_per_s"]) for r in rs],
            dispatch_during_append=(
                "held off: the bench holds the store's dispatch lock during the appends, so the "
                "background dispatch thread waits (dispatched offset at the end of the appends "
                "is reported); the async CommitLog flusher runs"
            ),
            dispatched_offset_at_append_end=rs[0]["dispatched_offset_at_append_end"],
            **app,
        )
        dis = medians(rs, dispatch_keys)
        emit(
            "dispatch" if kind == "plain" else "dispatch_keyed",
            kind=kind,
            messages=KIND_DOC[kind],
            msgs=n,
            runs=runs,
            how="dispatcher.dispatch(max_offset) in the caller's thread under the dispatch lock",
            dispatch_msgs_per_s_runs=[round(r["dispatch_msgs_per_s"]) for r in rs],
            **dis,
        )
        agg[kind] = {**app, **dis}
    if a.profile:
        for kind in KINDS:
            log(f"profile: append+dispatch {kind} (not counted)")
            root = fresh(f"profile-{kind}")
            append_dispatch_run(root, kind, n, file_bytes, profile=True)
            shutil.rmtree(root, ignore_errors=True)

    # 2. Durable group commit.
    durable: list[Record] = []
    for i in range(runs):
        log(f"durable: run {i + 1}/{runs}, {DURABLE_THREADS} threads, {durable_s} s")
        root = fresh("durable")
        r = durable_run(root, durable_s, DURABLE_THREADS, file_bytes)
        shutil.rmtree(root, ignore_errors=True)
        durable.append(r)
        emit("durable_group_commit.run", run=i + 1, **r)
    dkeys = ["msgs_per_s", "p50_ms", "p90_ms", "p99_ms", "msync_groups", "msgs_per_group"]
    dur = medians(durable, dkeys)
    emit(
        "durable_group_commit",
        threads=DURABLE_THREADS,
        duration_s=durable_s,
        runs=runs,
        msgs_per_s_runs=[round(r["msgs_per_s"]) for r in durable],
        not_put_ok=sum(r["not_put_ok"] for r in durable),
        msync_groups_how="flusher-thread CommitLog.flush calls that advanced the flushed offset",
        **dur,
    )

    # 4 + 5. Crash, recovery and memory.
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
