"""Storage benchmark cases 1 and 3: ``append_async`` (ASYNC flush, batches of 256 messages,
wall time of the ``put_messages`` calls only) and ``dispatch`` (the whole backlog, ConsumeQueue +
index), each with plain and with keyed messages. Part of ``store_bench.py``."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import time
from collections.abc import Callable

from store_common import (
    BATCH,
    BODY_BYTES,
    KIND_DOC,
    KINDS,
    Record,
    Workload,
    emit,
    log,
    medians,
    mem_status,
    store_config,
)

from tidemq.storage import FlushMode, MessageStore


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
        # Why hold dispatch: the store's own "dispatch" thread would otherwise dispatch
        # concurrently with the appends and take the GIL from them (2 cores, one GIL), so neither
        # the append rate nor the dispatch rate would be measured alone. ``dispatch_held`` holds
        # the lock ``dispatch_now`` and the dispatch thread take around every dispatch step,
        # which parks that thread (and the checkpoint writer, which takes it too) until we let
        # go. The async CommitLog flusher keeps running, as it would in the broker. After the
        # appends we run ``dispatch_now`` still inside the block, in this thread (in ASYNC mode
        # it dispatches up to the CommitLog's max offset), so there is no window in which the
        # background thread could take the work over and the measured time is the dispatch of
        # the whole backlog, nothing else.
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
            end = s.log.max_offset
            dispatched_at_append_end = s.dispatched_offset

            dprof = cProfile.Profile() if profile else None
            t = time.perf_counter()
            c = time.thread_time()
            pc = time.process_time()
            if dprof is not None:
                dprof.enable()
            count = 0
            while s.dispatched_offset < end:
                got = s.dispatch_now()
                count += got
                if got == 0 and s.dispatched_offset < end:
                    raise RuntimeError(f"dispatch stuck at {s.dispatched_offset} < {end}")
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


APPEND_KEYS = [
    "append_msgs_per_s",
    "append_MBps_bodies",
    "append_MBps_log",
    "append_cpu_s",
    "append_cpu_us_per_msg",
    "append_process_cpu_s",
    "append_put_wall_s",
]
DISPATCH_KEYS = [
    "dispatch_msgs_per_s",
    "dispatch_s",
    "dispatch_cpu_s",
    "dispatch_cpu_us_per_msg",
]


def run_append_dispatch(
    a: argparse.Namespace, n: int, runs: int, file_bytes: int, fresh: Callable[[str], str]
) -> tuple[dict[str, list[Record]], dict[str, Record]]:
    """Every run appends then dispatches, alternating the kinds inside each run; emits each run
    and the medians. Returns the runs and the medians per kind."""
    per_kind: dict[str, list[Record]] = {k: [] for k in KINDS}
    for i in range(runs):
        for kind in KINDS:
            log(f"append+dispatch {kind}: run {i + 1}/{runs}, {n} msgs")
            root = fresh(f"append-{kind}")
            r = append_dispatch_run(root, kind, n, file_bytes)
            shutil.rmtree(root, ignore_errors=True)
            per_kind[kind].append(r)
            emit("append_dispatch.run", run=i + 1, **r)
    agg: dict[str, Record] = {}
    for kind in KINDS:
        rs = per_kind[kind]
        app = medians(rs, APPEND_KEYS)
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
        dis = medians(rs, DISPATCH_KEYS)
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
    return per_kind, agg
