"""Storage benchmark case 2: ``durable_group_commit``: SYNC flush, 64 threads each putting one
message and waiting for it to be durable, for a fixed time; msgs/s, latency percentiles and the
number of msync groups. Part of ``store_bench.py``."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable

from store_common import (
    BODY_BYTES,
    QUEUES,
    TOPIC,
    Record,
    emit,
    log,
    medians,
    pct,
    store_config,
)

from tidemq.storage import FlushMode, Message, MessageStore, PutStatus

DURABLE_THREADS = 64


def durable_run(root: str, duration_s: float, threads: int, file_bytes: int) -> Record:
    s = MessageStore(store_config(root, file_bytes, FlushMode.SYNC)).open()
    try:
        body = os.urandom(BODY_BYTES)
        # Warm-up: the first put creates (fallocates) the CommitLog file.
        s.put_messages([Message(TOPIC, body, tags="TagA")]).wait()

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
        # msync groups: flushes by the flusher thread that moved the flushed offset.
        groups_before = s.commitlog_flushes
        t0 = time.perf_counter()
        c0 = time.process_time()
        time.sleep(duration_s)
        stop.set()
        for th in ts:
            th.join()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        n_groups = s.commitlog_flushes - groups_before
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


def run_durable(
    runs: int, durable_s: float, file_bytes: int, fresh: Callable[[str], str]
) -> tuple[list[Record], Record]:
    """The runs, each emitted, then their medians; returns both."""
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
    return durable, dur
