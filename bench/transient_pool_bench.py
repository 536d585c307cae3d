"""The transient store pool against the direct path, and the page warming mechanisms (issue 22).

usage: python bench/transient_pool_bench.py [--gib 1] [--runs 3] [--file-mib 256]
           [--old-gib 4] [--warm-gib 0.5] [--cases warming,pool] [--settle-s 5] [--quick]

Prints one JSON object per line on stdout (``{"bench": name, "load1": ..., ...}``, as
``store_bench.py``), progress on stderr, and last a ``{"bench": "summary", ...}`` line with the
medians of every variant. In-process, no gRPC; 1 KiB bodies, 8 queues, batches of 256
``Message``s through ``MessageStore.put_messages``, ASYNC flush. Variants run interleaved inside
each run (run 1 of every variant, then run 2, ...), every other run in reverse order, so that
they share the machine's load.

1. ``warming``: ``--warm-gib`` of puts into a fresh store, dispatch held off (as
   ``store_bench.py``'s append) so the writer is measured alone, once per mechanism: ``off``
   (``warm_ahead_bytes = 0``), ``preadv`` (the fallback: MADV_WILLNEED and reads into a scratch
   buffer, forced by pretending the kernel lacks MADV_POPULATE_*) and ``madvise``
   (MADV_POPULATE_READ, the default). Figures: msgs/s, CPU per message of the writer thread and
   of the whole process, and disk writes (``/proc/self/io`` write_bytes up to and including the
   close's flush) over the log's bytes. Then ``warming_paced``: the same at a moderate 64 MB/s
   for 4 s with the 500 ms flusher running, where a flush comes while warmed pages still wait
   for their data, with one more mechanism, ``madvise_write`` (MADV_POPULATE_WRITE): the ratio
   shows whether zeros reach the disk before the data.
2. ``pool``: ``--gib`` of puts, 8 puts in flight (a put's latency is from the call to its
   durable future: with the pool, the commit), everything running (dispatch, flusher, warmer,
   commit thread), ``direct`` and ``pool`` (``transient_store_pool_enable``, 5 buffers), each
   ``quiet`` and under ``pressure``: a child process reading a multi-GiB old file
   (``--old-gib``, written first, evicted from the page cache before each run) sequentially with
   plain 1 MiB reads while the puts run. Figures: msgs/s until the last put is durable, put
   p50/p99 (ms), time to dispatched p99, CPU per message (writer thread, process) and the
   reader's MB/s.

Before every run the previous run's store is deleted and the bench waits ``--settle-s``: on the
development VMs memory freed more than about 2 s ago has gone back to the host, and a first touch
of it costs far more than of memory freed a moment ago (docs/storage.md, "Pages"). A broker whose
page cache has grown writes into such memory, so the runs do too.

The scratch directory (``$TMPDIR`` or /tmp, ``tidemq-bench-*``) is deleted at the end.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from store_common import (
    BATCH,
    BODY_BYTES,
    Record,
    Workload,
    config_fields,
    emit,
    git_state,
    loadavg,
    log,
    median,
    pct,
)

from tidemq.storage import FlushMode, MessageStore, PutStatus, StoreConfig, pages

WARM_MODES = ("off", "preadv", "madvise")
PACED_MODES = ("off", "preadv", "madvise", "madvise_write")
POOL_PATHS = ("direct", "pool")
PRESSURES = ("quiet", "pressure")
IN_FLIGHT = 8
POOL_BUFFERS = 5
PACED_MBPS = 64.0
PACED_S = 4.0
READ_CHUNK = 1 << 20


def write_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


class WarmMode:
    """Puts the store's warming into one mechanism for the length of a run."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._populate = pages.populate

    def __enter__(self) -> WarmMode:
        real = self._populate
        if self.mode == "preadv":
            pages.POPULATE.supported = False
        elif self.mode == "madvise_write":

            def populate_write(addr: int, length: int, *, write: bool) -> int:
                return real(addr, length, write=True)

            pages.populate = populate_write
        return self

    def __exit__(self, *exc: object) -> None:
        pages.POPULATE.supported = True
        pages.populate = self._populate


def config(root: str, file_bytes: int, **kw: Any) -> StoreConfig:
    return StoreConfig(
        root,
        commitlog_file_size_bytes=file_bytes,
        flush_mode=FlushMode.ASYNC,
        message_index_enable=True,
        **kw,
    )


# ===================================================================== 1. warming
def warming_run(root: str, mode: str, n: int, file_bytes: int, rate_mbps: float = 0.0) -> Record:
    """``n`` messages (or ``PACED_S`` seconds at ``rate_mbps``) into a fresh store."""
    wl = Workload("plain")
    batch = wl.plain
    cfg = config(root, file_bytes, warm_ahead_bytes=0 if mode == "off" else 64 << 20)
    with WarmMode(mode):
        s = MessageStore(cfg).open()
        try:
            # A store at rest: its first file made and, with warming, its window warm.
            s.put_messages(batch)
            warmer = s._lifecycle.warmer
            deadline = time.monotonic() + 10
            window = min(64 << 20, file_bytes)
            while warmer is not None and warmer.warmed < window and time.monotonic() < deadline:
                time.sleep(0.01)
            io0 = write_bytes()
            done = 0
            with s.dispatch_held():
                c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
                while done < n:
                    s.put_messages(batch)
                    done += BATCH
                    if rate_mbps:
                        ahead = done * BODY_BYTES / (rate_mbps * 1e6) - (time.perf_counter() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
                        if time.perf_counter() - t0 >= PACED_S:
                            break
                c1, p1, t1 = time.thread_time(), time.process_time(), time.perf_counter()
                log_bytes = s.commitlog.max_offset
        finally:
            s.close()  # its flush's writes count: they are the data (and whatever else is dirty)
        io1 = write_bytes()
    wall = t1 - t0
    return {
        "mode": mode,
        "msgs": done,
        "msgs_per_s": done / wall,
        "writer_cpu_us_per_msg": (c1 - c0) / done * 1e6,
        "process_cpu_us_per_msg": (p1 - p0) / done * 1e6,
        "disk_writes_over_log_bytes": (io1 - io0) / log_bytes,
        "log_bytes": log_bytes,
        "rate_MBps": rate_mbps or None,
    }


# ===================================================================== 2. pool vs direct
def make_old_file(path: str, gib: float) -> int:
    size = int(gib * (1 << 30))
    chunk = os.urandom(8 << 20)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        pos = 0
        while pos < size:
            pos += os.pwrite(fd, chunk[: size - pos], pos)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return size


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def reader_main(path: str) -> int:
    """The child that reads old data: sequential plain reads, from the start again at the end
    (the file evicted first, so every pass reads the disk); on SIGTERM it prints the bytes read
    and the seconds it ran."""
    fd = os.open(path, os.O_RDONLY)
    buf = memoryview(bytearray(READ_CHUNK))
    total = 0
    t0 = time.perf_counter()

    def report(*_: object) -> None:
        print(f"{total} {time.perf_counter() - t0}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, report)
    print("ready", flush=True)
    while True:
        n = os.readv(fd, [buf])
        if n == 0:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.lseek(fd, 0, os.SEEK_SET)
            continue
        total += n


class Reader:
    def __init__(self, path: str) -> None:
        evict(path)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--reader", path],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the reader did not start")

    def stop(self) -> float:
        """Stop it; the MB/s it read."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        total, secs = out.split()
        return int(total) / float(secs) / 1e6


def pool_run(root: str, path: str, pressure: str, n: int, file_bytes: int, old: str) -> Record:
    wl = Workload("plain")
    batch = wl.plain
    cfg = config(
        root,
        file_bytes,
        transient_store_pool_enable=path == "pool",
        transient_store_pool_buffers=POOL_BUFFERS,
    )
    s = MessageStore(cfg).open()
    reader = Reader(old) if pressure == "pressure" else None
    lat: list[float] = []
    dlat: list[float] = []
    lock = threading.Lock()

    def timed(t0: float, into: list[float]) -> Callable[[Future[Any]], None]:
        def done(_: Future[Any]) -> None:
            t = time.perf_counter() - t0
            with lock:
                into.append(t)

        return done

    try:
        inflight: collections.deque[Future[PutStatus]] = collections.deque()
        last_dispatched: Future[None] | None = None
        done = 0
        c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
        while done < n:
            if len(inflight) >= IN_FLIGHT and inflight.popleft().result(60) is not PutStatus.PUT_OK:
                raise RuntimeError("a put was not PUT_OK")
            t = time.perf_counter()
            r = s.put_messages(batch)
            r.durable.add_done_callback(timed(t, lat))
            r.dispatched.add_done_callback(timed(t, dlat))
            inflight.append(r.durable)
            last_dispatched = r.dispatched
            done += BATCH
        for fut in inflight:
            fut.result(60)
        c1, p1, t1 = time.thread_time(), time.process_time(), time.perf_counter()
        assert last_dispatched is not None
        last_dispatched.result(60)
        reader_mbps = reader.stop() if reader is not None else None
        reader = None
        stats = s.page_stats
    finally:
        if reader is not None:
            reader.stop()
        s.close()
    wall = t1 - t0
    with lock:
        lat_ms = [x * 1000 for x in lat]
        dlat_ms = [x * 1000 for x in dlat]
    return {
        "path": path,
        "pressure": pressure,
        "msgs": done,
        "msgs_per_s": done / wall,
        "put_p50_ms": pct(lat_ms, 50),
        "put_p99_ms": pct(lat_ms, 99),
        "dispatched_p99_ms": pct(dlat_ms, 99),
        "writer_cpu_us_per_msg": (c1 - c0) / done * 1e6,
        "process_cpu_us_per_msg": (p1 - p0) / done * 1e6,
        "reader_MBps": reader_mbps,
        "pool_commits": stats.commits,
        "pool_misses": stats.pool_misses,
        "mlock_failures": stats.mlock_failures,
    }


# ===================================================================== main
def per_msg(gib: float) -> int:
    """Messages in ``gib`` of bodies, whole batches."""
    return int(gib * (1 << 30)) // BODY_BYTES // BATCH * BATCH


FIGURES = (
    "msgs_per_s",
    "writer_cpu_us_per_msg",
    "process_cpu_us_per_msg",
    "disk_writes_over_log_bytes",
    "put_p50_ms",
    "put_p99_ms",
    "dispatched_p99_ms",
    "reader_MBps",
)


def medians_of(rs: Sequence[Record]) -> Record:
    return {
        k: round(median([r[k] for r in rs]), 3)
        for k in FIGURES
        if rs and all(r.get(k) is not None for r in rs)
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gib", type=float, default=None, help="GiB of bodies per pool run (1)")
    ap.add_argument("--warm-gib", type=float, default=None, help="GiB per warming run (0.5)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--file-mib", type=int, default=256, help="CommitLog file size")
    ap.add_argument("--old-gib", type=float, default=None, help="old data the reader reads (4)")
    ap.add_argument("--cases", default="warming,pool")
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, one run")
    ap.add_argument(
        "--settle-s", type=float, default=5.0, help="pause before each run (freed memory settles)"
    )
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.reader:
        return reader_main(a.reader)

    quick = a.quick
    gib = a.gib if a.gib is not None else (0.0625 if quick else 1.0)
    warm_gib = a.warm_gib if a.warm_gib is not None else (0.0625 if quick else 0.5)
    old_gib = a.old_gib if a.old_gib is not None else (0.25 if quick else 4.0)
    runs = 1 if quick else max(1, a.runs)
    file_bytes = (64 if quick else a.file_mib) << 20
    cases = set(a.cases.split(","))
    base = os.environ.get("TMPDIR") or "/tmp"
    scratch = tempfile.mkdtemp(prefix="tidemq-bench-", dir=base)
    started = time.perf_counter()
    try:
        emit(
            "config",
            gib=gib,
            warm_gib=warm_gib,
            old_gib=old_gib,
            runs=runs,
            batch=BATCH,
            body_bytes=BODY_BYTES,
            in_flight=IN_FLIGHT,
            pool_buffers=POOL_BUFFERS,
            commitlog_file_bytes=file_bytes,
            python=sys.version.split()[0],
            kernel=os.uname().release,
            cpus=os.cpu_count(),
            loadavg=loadavg(),
            git=git_state(),
            store_config=config_fields(config(scratch, file_bytes)),
        )
        results: dict[str, dict[str, list[Record]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )

        def fresh(name: str) -> str:
            path = os.path.join(scratch, name)
            shutil.rmtree(path, ignore_errors=True)
            # The page cache the last run freed goes back to the host after about 2 s (the
            # VM's free page reporting): waiting makes every run write fresh memory, as a
            # broker does once its page cache has grown, not memory freed a moment ago.
            time.sleep(a.settle_s)
            return path

        old = os.path.join(scratch, "old-data")
        if "pool" in cases:
            log(f"writing {old_gib} GiB of old data for the reader")
            make_old_file(old, old_gib)
        for i in range(runs):
            # Every other run goes through the variants backwards: a burst of load from a
            # neighbour then does not always land on the same one.
            order: Callable[[Sequence[str]], Sequence[str]] = (
                (lambda xs: xs) if i % 2 == 0 else (lambda xs: xs[::-1])
            )
            if "warming" in cases:
                for mode in order(WARM_MODES):
                    log(f"warming {mode}: run {i + 1}/{runs}")
                    r = warming_run(fresh("w"), mode, per_msg(warm_gib), file_bytes)
                    results["warming"][mode].append(r)
                    emit("warming.run", run=i + 1, **r)
                for mode in order(PACED_MODES):
                    log(f"warming_paced {mode}: run {i + 1}/{runs}")
                    n = per_msg(PACED_MBPS * PACED_S / 1024)
                    r = warming_run(fresh("w"), mode, n, file_bytes, rate_mbps=PACED_MBPS)
                    results["warming_paced"][mode].append(r)
                    emit("warming_paced.run", run=i + 1, **r)
            if "pool" in cases:
                for pressure in PRESSURES:
                    for path in order(POOL_PATHS):
                        log(f"pool {path} {pressure}: run {i + 1}/{runs}")
                        r = pool_run(fresh("p"), path, pressure, per_msg(gib), file_bytes, old)
                        results["pool"][f"{path}/{pressure}"].append(r)
                        emit("pool.run", run=i + 1, **r)
        summary = {
            case: {variant: medians_of(rs) for variant, rs in by_variant.items()}
            for case, by_variant in results.items()
        }
        for case, by_variant in summary.items():
            for variant, med in by_variant.items():
                emit(f"{case}.median", variant=variant, runs=runs, **med)
        emit(
            "summary",
            runs=runs,
            medians=summary,
            loadavg_end=loadavg(),
            elapsed_s=time.perf_counter() - started,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
