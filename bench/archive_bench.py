"""Archive benchmark (docs/archive.md): archive throughput beside the produce rate and perfkit's
disk write ceiling, and reads past retention (from the archive) beside local reads, in one run.

usage: python bench/archive_bench.py --perfkit ../shared/perfkit [--runs 3] [--mb 512] [--s3]

Goals of the issue ("Archive and tiered storage"): archiving keeps up with >= 0.5 of the produce
rate's bytes; archived reads >= 0.3 of local reads.

Each run, on a fresh store in one scratch directory (the archive directories and perfkit's scratch
files on the same filesystem):

1. ``produce``: ``--mb`` MiB of 1 KiB bodies put with ``put_messages`` in batches of ``--batch``
   (32) over ``--queues`` queues of one topic, ASYNC flush, the store's dispatch running in the
   background as in a broker; CommitLog files of ``--file-mib`` (64) MiB. The rate is CommitLog
   bytes over the wall time of the ``put_messages`` calls (building the batches is the producer's
   work and is not counted); ``produce_dispatched_MBps`` also counts the wait until dispatch has
   published everything.
2. ``archive``: the store reopened with an archive of each compression (``none``, then ``zstd``,
   the default) in its own directory, and one ``run_archive`` pass timed: every sealed CommitLog
   file scanned, chunked (``--chunk-mib``, 8), compressed, written (write + fsync + rename),
   read back and verified, and its manifest entry written (what the archiver thread does).
   MB/s of CommitLog bytes archived per wall second and per process CPU second. With ``--s3``
   the same pass (zstd) to moto's S3 server on loopback, a Python server in a process of its
   own: a label, not a ceiling (its CPU is reported).
3. ``read``: queue 0 consumed from offset 0 with ``get_records`` (``--read-batch`` 32 records,
   256 KiB per pull) over the range the archive holds, first from the local files (two passes:
   ``local`` is the second, the first is reported); then retention deletes every archived file
   and the same range is consumed from the archive (zstd), on a store just reopened: ``cold``
   (the reader's chunk cache empty: every chunk fetched, MD5-checked, decompressed) and
   ``warm`` (a second pass, every chunk in the cache, which is sized to hold the range). A
   chunk holds every queue's records, so a cold read of one queue of ``--queues`` decompresses
   ``--queues`` times what it returns; ``group`` reads every queue, a pull of each in turn (a
   consumer group catching up), locally and cold from the archive (reopened again). The
   archive's files and the CommitLog are in the page cache throughout: no pass reads the device.
4. ``ceiling``: perfkit's ``disk.py`` (``--skip-fio``), once before the runs with ``--runs``
   runs: dd and Python sequential writes with fdatasync, the disk write ceiling the archive's
   write rate is set beside; and perfkit's ``calib.py`` (CPU one Python thread gets).

Bodies (``--body``): ``text`` (default) is JSON-like text with 512 random hex digits each
(zstd stores about half of it, as it would real payloads with ids); ``random`` is incompressible.

Prints one JSON object per line on stdout (``{"bench": name, ...}``), progress on stderr, and last
a ``summary`` line: the median of every figure over the runs, the median of each run's ratios
(each run's figures share that run's machine load), the ceilings, and one boolean per goal.
CPU figures are the process's CPU time (every thread) per MB: ``*_cpu_ms_per_MB``; the ratio of
archiving's to producing's (``archive_*_cpu_per_MB_vs_produce``) says what the machine's load
cannot: below 2, archiving keeps up with half the produce rate on the same CPU.
The scratch directory (``$TMPDIR`` or /tmp, ``tidemq-archive-bench-*``) is deleted at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from store_common import REPO, Record, git_state, loadavg, log, median

from tidemq.storage import FlushMode, Message, MessageStore, StoreConfig
from tidemq.storage.archive.config import ArchiveConfig

TOPIC = "ArchiveBench"
BODY_BYTES = 1024
MB = 1e6
MIB = 1 << 20
# Goals of the issue.
GOAL_ARCHIVE_VS_PRODUCE = 0.5
GOAL_ARCHIVED_READ_VS_LOCAL = 0.3
RETENTION_AHEAD_S = 73 * 3600.0  # past file_reserved_time_hours (72)
# moto's credentials (tests/s3_server.py): any value is accepted.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "tidemq-bench",
    "AWS_SECRET_ACCESS_KEY": "tidemq-bench-secret",
    "AWS_REGION": "us-east-1",
}


# ===================================================================== output
def _sig(v: Any) -> Any:
    """Floats to 4 significant digits (ratios and CPU per MB are small numbers)."""
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {k: _sig(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_sig(x) for x in v]
    return v


def emit(name: str, **kv: Any) -> None:
    """One machine-readable result line on stdout (perfkit's format, without the prefix)."""
    print(json.dumps({"bench": name, "load1": loadavg()[0], **_sig(kv)}), flush=True)


# ===================================================================== workload
class Bodies:
    """1 KiB bodies, every one different. ``text``: a JSON-like record whose ``payload`` is 512
    hex digits cut from a pool of random bytes (never repeated within a chunk); ``random``:
    random bytes cut from a pool."""

    POOL_BYTES = 96 * MIB

    def __init__(self, kind: str) -> None:
        self.kind = kind
        raw = os.urandom(self.POOL_BYTES // 2 if kind == "text" else self.POOL_BYTES)
        self.pool = raw.hex().encode() if kind == "text" else raw
        self.at = 0

    def _cut(self, n: int) -> bytes:
        if self.at + n > len(self.pool):
            self.at = (self.at % 97) + 1  # wrap, shifted: the next pass is not the last one
        out = self.pool[self.at : self.at + n]
        self.at += n
        return out

    def body(self, i: int) -> bytes:
        if self.kind == "random":
            return self._cut(BODY_BYTES)
        head = (
            b'{"order_id":%d,"customer":"c-%07d","status":"%s","amount_cents":%d,'
            b'"currency":"EUR","items":%d,"ts":%d,"payload":"'
            % (
                i,
                (i * 7919) % 10_000_000,
                (b"NEW", b"PAID", b"SHIPPED", b"DELIVERED")[i % 4],
                (i * 104729) % 1_000_000,
                i % 9 + 1,
                1_760_000_000_000 + i,
            )
        )
        tail = b'"}'
        return head + self._cut(BODY_BYTES - len(head) - len(tail)) + tail


def store_config(
    root: str, a: argparse.Namespace, archive: ArchiveConfig | None = None
) -> StoreConfig:
    return StoreConfig(
        root,
        commitlog_file_size_bytes=a.file_mib * MIB,
        flush_mode=FlushMode.ASYNC,
        delete_file_batch_max=1000,
        archive=archive,
    )


def archive_config(
    uri: str, a: argparse.Namespace, compression: str, s3: str = "", cache: int = 256 * MIB
) -> ArchiveConfig:
    level = {} if a.zstd_level is None else {"zstd_level": a.zstd_level}
    return ArchiveConfig(
        uri,
        compression=compression,
        chunk_bytes=a.chunk_mib * MIB,
        cache_bytes=cache,
        interval_ms=3_600_000,  # the passes are run here, not by the archiver thread
        s3_endpoint_url=s3,
        **level,
    )


@contextmanager
def opened(cfg: StoreConfig) -> Iterator[MessageStore]:
    # A fixed disk usage: retention then deletes by age only, as it does at its delete hour.
    s = MessageStore(cfg, disk_usage_ratio=lambda: 0.1).open()
    try:
        yield s
    finally:
        s.close()


class Clock:
    """Wall and process CPU time (all threads) of a block."""

    def __enter__(self) -> Clock:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


# ===================================================================== phases
def produce(s: MessageStore, a: argparse.Namespace) -> Record:
    bodies = Bodies(a.body)
    n = a.mb * MIB // BODY_BYTES
    start = s.commitlog.max_offset
    put_wall = build_cpu = 0.0
    done = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while done < n:
        c = time.thread_time()
        k = min(a.batch, n - done)
        batch = [
            Message(TOPIC, bodies.body(i), queue_id=i % a.queues, tags="TagA")
            for i in range(done, done + k)
        ]
        build_cpu += time.thread_time() - c
        t = time.perf_counter()
        s.put_messages(batch)
        put_wall += time.perf_counter() - t
        done += k
    t = time.perf_counter()
    if not s.wait_dispatched(s.commitlog.max_offset, 600):
        raise RuntimeError("dispatch did not catch up within 600 s")
    dispatch_wait = time.perf_counter() - t
    cpu = time.process_time() - cpu0 - build_cpu
    logged = s.commitlog.max_offset - start
    return {
        "produce_msgs": n,
        "produce_MBps": logged / put_wall / MB,
        "produce_msgs_per_s": n / put_wall,
        "produce_bodies_MBps": n * BODY_BYTES / put_wall / MB,
        "produce_dispatched_MBps": logged / (put_wall + dispatch_wait) / MB,
        "produce_cpu_ms_per_MB": cpu * 1e3 / (logged / MB),
        "produce_commitlog_bytes": logged,
        "produce_wall_s_incl_batch_building": time.perf_counter() - wall0,
    }


def archive_pass(s: MessageStore, label: str, prof: cProfile.Profile | None = None) -> Record:
    """One ``run_archive`` pass over every sealed file, timed."""
    assert s.archiver is not None
    counts = s.archiver.counts
    before_bytes, before_stored = counts.bytes_archived, counts.bytes_stored
    sealed = len(s.commitlog.mfq.files) - 1
    with Clock() as c:
        if prof is not None:
            prof.enable()
        files = s.run_archive()
        if prof is not None:
            prof.disable()
    if files != sealed or counts.failures:
        raise RuntimeError(
            f"archive {label}: {files} of {sealed} sealed files archived; {counts.last_error}"
        )
    nbytes = counts.bytes_archived - before_bytes
    stored = counts.bytes_stored - before_stored
    p = f"archive_{label}_"
    return {
        p + "files": files,
        p + "MBps": nbytes / c.wall / MB,
        p + "MBps_per_cpu_s": nbytes / c.cpu / MB,
        p + "cpu_ms_per_MB": c.cpu * 1e3 / (nbytes / MB),
        p + "stored_MBps": stored / c.wall / MB,  # what was written to the archive
        p + "stored_ratio": stored / nbytes,
        p + "wall_s": c.wall,
        p + "bytes": nbytes,
    }


def read_manifest(s: MessageStore) -> None:
    """The archive's manifest, read now (a store reads it in its archiver thread after opening):
    an archiving pass, which finds nothing left to archive."""
    assert s.archiver is not None
    if s.run_archive() != 0 or not s.archiver.read_manifest():
        raise RuntimeError("the archive's manifest is not what this run wrote")


def archived_ends(s: MessageStore, queues: int) -> list[int]:
    """Per queue, the end of its range in the archive (the local reads read the same ranges)."""
    assert s.archiver is not None
    read_manifest(s)
    ends = []
    for q in range(queues):
        got = s.archiver.reader.queue_range(TOPIC, q)
        if got is None or got[0] != 0:
            raise RuntimeError(f"the archive holds {got} of {TOPIC}/{q}")
        ends.append(got[1])
    return ends


def read_pass(
    s: MessageStore,
    a: argparse.Namespace,
    ends: Sequence[int],
    label: str,
    prof: cProfile.Profile | None = None,
) -> Record:
    """Each queue ``q`` of ``ends`` from offset 0 to ``ends[q]`` with ``get_records``, as
    consumers pull: one pull of ``--read-batch`` records per queue in turn (a consumer group
    catching up; with one queue, one consumer reading it)."""
    at = [0] * len(ends)
    count = nbytes = calls = 0
    with Clock() as c:
        if prof is not None:
            prof.enable()
        left = [q for q in range(len(ends)) if ends[q] > 0]
        while left:
            for q in left:
                n = min(a.read_batch, ends[q] - at[q])
                got = s.get_records(TOPIC, q, at[q], max_count=n, max_bytes=256 * 1024)
                if got.next_offset <= at[q]:
                    raise RuntimeError(f"read {label}: no progress at {q}/{at[q]}")
                at[q] = got.next_offset
                count += got.count
                nbytes += len(got.records)
                calls += 1
            left = [q for q in left if at[q] < ends[q]]
        if prof is not None:
            prof.disable()
    if count != sum(ends):
        raise RuntimeError(f"read {label}: {count} records, {sum(ends)} wanted")
    p = f"read_{label}_"
    return {
        p + "msgs_per_s": count / c.wall,
        p + "MBps": nbytes / c.wall / MB,
        p + "cpu_ms_per_MB": c.cpu * 1e3 / (nbytes / MB),
        p + "calls": calls,
        p + "wall_s": c.wall,
    }


def archived_read(
    cfg: StoreConfig,
    a: argparse.Namespace,
    ends: Sequence[int],
    label: str,
    warm: bool,
    prof: cProfile.Profile | None = None,
) -> Record:
    """``read_pass`` from the archive on a store just opened (its reader's cache empty: cold),
    then with ``warm`` a second pass (every chunk in the cache)."""
    out: Record = {}
    with opened(cfg) as s:
        assert s.archiver is not None
        read_manifest(s)
        if s.min_offset(TOPIC, 0) != 0 or s.commitlog.min_offset == 0:
            raise RuntimeError("the archived range is not past local retention")
        counts = s.archiver.reader.counts
        fetches = counts.chunk_fetches
        out.update(read_pass(s, a, ends, f"{label}_cold", prof))
        out[f"read_{label}_cold_chunk_fetches"] = counts.chunk_fetches - fetches
        if warm:
            fetches = counts.chunk_fetches
            out.update(read_pass(s, a, ends, f"{label}_warm"))
            out[f"read_{label}_warm_chunk_fetches"] = counts.chunk_fetches - fetches
    return out


def expire_archived(s: MessageStore) -> int:
    """Retention as at its delete hour, 73 hours on: every archived file goes."""
    deleted = 0
    while True:
        n = s.run_retention(now_s=time.time() + RETENTION_AHEAD_S, manual=True)
        if n == 0:
            return deleted
        deleted += n


# ===================================================================== S3 (moto)
class MotoServer:
    """moto's S3 server in a process of its own on loopback (a Python server: a label, never a
    ceiling)."""

    def __init__(self, log_path: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        with open(log_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **S3_ENV},
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start (see {log_path})") from None
                time.sleep(0.1)

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def bucket(self) -> str:
        import boto3  # noqa: PLC0415 - only with --s3

        name = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(
            Bucket=name
        )
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ===================================================================== one run
def one_run(run: int, a: argparse.Namespace, scratch: str, moto: MotoServer | None) -> Record:
    d = os.path.join(scratch, f"run{run}")
    os.makedirs(d)
    root = os.path.join(d, "store")
    prof = cProfile.Profile() if a.profile and run == 0 else None
    out: Record = {}
    # 1. Produce (no archive configured: the archiver thread is not there to take the GIL).
    with opened(store_config(root, a)) as s:
        out.update(produce(s, a))
    log(f"run {run}: produced {out['produce_MBps']:.1f} MB/s")
    # 2. Archive, each compression to its own directory (an archive must exist: a mount point).
    for compression in ("none", "zstd"):
        arch = os.path.join(d, f"archive-{compression}")
        os.makedirs(arch)
        cfg = store_config(root, a, archive_config(arch, a, compression))
        with opened(cfg) as s:
            out.update(
                archive_pass(s, f"dir_{compression}", prof if compression == "zstd" else None)
            )
        log(f"run {run}: archive {compression} {out[f'archive_dir_{compression}_MBps']:.1f} MB/s")
        if compression == "none":
            shutil.rmtree(arch)  # only zstd is read back: keep the disk use down
    if moto is not None:
        bucket = moto.bucket()
        cfg = store_config(
            root, a, archive_config(f"s3://{bucket}/bench", a, "zstd", moto.endpoint)
        )
        with opened(cfg) as s:
            cpu0 = moto.cpu_s()
            got = archive_pass(s, "moto_s3_zstd")
            got["archive_moto_s3_zstd_server_cpu_ms_per_MB"] = (
                (moto.cpu_s() - cpu0) * 1e3 / (got["archive_moto_s3_zstd_bytes"] / MB)
            )
            out.update(got)
        log(f"run {run}: archive moto S3 {out['archive_moto_s3_zstd_MBps']:.1f} MB/s")
    # 3. Reads: local, then from the archive after retention deleted the archived files.
    # The cache holds the whole archived range, so the warm pass is all hits (a smaller one,
    # LRU, under a sequential pass over more than it holds, would make it a cold one).
    cache = max(256 * MIB, out["produce_commitlog_bytes"] + 2 * a.chunk_mib * MIB)
    out["read_archive_cache_bytes"] = cache
    arch = os.path.join(d, "archive-zstd")
    cfg = store_config(root, a, archive_config(arch, a, "zstd", cache=cache))
    with opened(cfg) as s:
        ends = archived_ends(s, a.queues)
        first = read_pass(s, a, ends[:1], "local")
        out["read_local_first_MBps"] = first["read_local_MBps"]
        out.update(read_pass(s, a, ends[:1], "local"))
        if a.queues > 1:
            out.update(read_pass(s, a, ends, "group_local"))
        deleted = expire_archived(s)
        if deleted != out["archive_dir_zstd_files"]:
            raise RuntimeError(f"retention deleted {deleted} files")
        cq = s.queues.get(TOPIC, 0)
        if cq is None or cq.min_offset < ends[0]:
            raise RuntimeError("the local ConsumeQueue still holds the archived range")
    out.update(archived_read(cfg, a, ends[:1], "archive", warm=True, prof=prof))
    if a.queues > 1:
        out.update(archived_read(cfg, a, ends, "group_archive", warm=False))
    out["read_records"] = ends[0]
    log(
        f"run {run}: read local {out['read_local_MBps']:.1f} MB/s, archive cold "
        f"{out['read_archive_cold_MBps']:.1f}, warm {out['read_archive_warm_MBps']:.1f}"
        + (
            f"; all queues: local {out['read_group_local_MBps']:.1f}, archive cold "
            f"{out['read_group_archive_cold_MBps']:.1f}"
            if a.queues > 1
            else ""
        )
    )
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        log("profile of run 0's zstd archive pass and cold archived read:\n" + buf.getvalue())
    shutil.rmtree(d, ignore_errors=True)
    return out


def ratios(r: Record) -> dict[str, float]:
    out = {
        "archive_zstd_vs_produce": r["archive_dir_zstd_MBps"] / r["produce_MBps"],
        "archive_none_vs_produce": r["archive_dir_none_MBps"] / r["produce_MBps"],
        "archive_zstd_vs_produce_dispatched": (
            r["archive_dir_zstd_MBps"] / r["produce_dispatched_MBps"]
        ),
        # CPU per MB archived over CPU per MB produced: under 2, archiving keeps up with half
        # the produce rate on the same CPU, whatever else the machine runs.
        "archive_zstd_cpu_per_MB_vs_produce": (
            r["archive_dir_zstd_cpu_ms_per_MB"] / r["produce_cpu_ms_per_MB"]
        ),
        "archive_none_cpu_per_MB_vs_produce": (
            r["archive_dir_none_cpu_ms_per_MB"] / r["produce_cpu_ms_per_MB"]
        ),
        "read_archive_cold_vs_local": r["read_archive_cold_MBps"] / r["read_local_MBps"],
        "read_archive_warm_vs_local": r["read_archive_warm_MBps"] / r["read_local_MBps"],
        "read_archive_cold_cpu_per_MB_vs_local": (
            r["read_archive_cold_cpu_ms_per_MB"] / r["read_local_cpu_ms_per_MB"]
        ),
    }
    if "read_group_archive_cold_MBps" in r:
        out["read_group_archive_cold_vs_local"] = (
            r["read_group_archive_cold_MBps"] / r["read_group_local_MBps"]
        )
    if "archive_moto_s3_zstd_MBps" in r:
        out["archive_moto_s3_zstd_vs_produce"] = r["archive_moto_s3_zstd_MBps"] / r["produce_MBps"]
    return out


# ===================================================================== perfkit
def perfkit_disk(perfkit: str, runs: int, scratch: str) -> Record:
    """perfkit's ``disk.py --skip-fio`` on the scratch filesystem: the disk write ceilings."""
    script = os.path.join(perfkit, "disk.py")
    if not os.path.exists(script):
        log(f"no {script}: the disk ceiling is skipped")
        return {}
    env = {**os.environ, "PERFKIT_TMP": os.path.join(scratch, "perfkit")}
    cmd = [sys.executable, script, "--runs", str(runs), "--skip-fio"]
    p = subprocess.run(
        cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=perfkit, timeout=1800, check=False
    )
    shutil.rmtree(env["PERFKIT_TMP"], ignore_errors=True)
    out: Record = {"script": script, "args": cmd[2:], "returncode": p.returncode}
    for line in p.stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[len("RESULT ") :])
        if r.get("bench") == "disk.py_write_1GiB_then_fdatasync":
            out["py_write_then_fdatasync_MBps"] = r["total_MBps"]
            out["py_write_then_fdatasync_MBps_runs"] = r["total_runs"]
            out["py_write_only_MBps"] = r["write_MBps"]
        elif r.get("bench") == "disk.dd" and r.get("bs") == "1M":
            flag = "fdatasync" if r["flag"] == "conv=fdatasync" else "dsync"
            out[f"dd_1M_{flag}_MBps"] = r["MBps_median"]
    if "py_write_then_fdatasync_MBps" not in out:
        log(f"perfkit disk.py printed no write ceiling (rc {p.returncode})")
    return out


def perfkit_calib(perfkit: str) -> Record:
    script = os.path.join(perfkit, "calib.py")
    if not os.path.exists(script):
        return {}
    p = subprocess.run(
        [sys.executable, script, "--label", "archive"], cwd=perfkit, capture_output=True,
        text=True, check=False, timeout=120,
    )  # fmt: skip
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return {}


# ===================================================================== main
def summary(
    runs: Sequence[Record],
    ceiling: Record,
    calib: Sequence[Record],
    a: argparse.Namespace,
    started: float,
    load_start: list[float],
) -> Record:
    keys = [k for k in runs[0] if all(isinstance(r.get(k), int | float) for r in runs)]
    med = {k: median([r[k] for r in runs]) for k in keys}
    per_run = [ratios(r) for r in runs]
    rat = {k: median([x[k] for x in per_run]) for k in per_run[0]}
    disk = ceiling.get("py_write_then_fdatasync_MBps")
    vs_disk = {}
    if disk:
        # The archive writes its stored (compressed) bytes: that is what the disk sees.
        vs_disk = {
            "archive_zstd_stored_vs_disk_ceiling": med["archive_dir_zstd_stored_MBps"] / disk,
            "archive_none_stored_vs_disk_ceiling": med["archive_dir_none_stored_MBps"] / disk,
            "archive_zstd_commitlog_vs_disk_ceiling": med["archive_dir_zstd_MBps"] / disk,
        }
    goals = {
        "archive_zstd_ge_0.5_produce": rat["archive_zstd_vs_produce"] >= GOAL_ARCHIVE_VS_PRODUCE,
        "archive_none_ge_0.5_produce": rat["archive_none_vs_produce"] >= GOAL_ARCHIVE_VS_PRODUCE,
        "read_archive_cold_ge_0.3_local": (
            rat["read_archive_cold_vs_local"] >= GOAL_ARCHIVED_READ_VS_LOCAL
        ),
        "read_archive_warm_ge_0.3_local": (
            rat["read_archive_warm_vs_local"] >= GOAL_ARCHIVED_READ_VS_LOCAL
        ),
    }
    if "read_group_archive_cold_vs_local" in rat:
        goals["read_group_archive_cold_ge_0.3_local"] = (
            rat["read_group_archive_cold_vs_local"] >= GOAL_ARCHIVED_READ_VS_LOCAL
        )
    return {
        "runs": len(runs),
        "mb": a.mb,
        "medians": med,
        "ratios": {**rat, **vs_disk},
        "ceilings": {"disk": ceiling, "calib": list(calib)},
        "goals": goals,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "git_end": git_state(),
        "elapsed_s": time.perf_counter() - started,
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=512, help="MiB of 1 KiB bodies per run")
    ap.add_argument("--file-mib", type=int, default=64, help="CommitLog file size")
    ap.add_argument("--chunk-mib", type=int, default=8, help="archive chunk size")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="messages per put_messages")
    ap.add_argument("--read-batch", type=int, default=32, help="records per get_records")
    ap.add_argument("--body", choices=("text", "random"), default="text")
    ap.add_argument(
        "--zstd-level", type=int, default=None, help="the archive's zstd level (its default: 1)"
    )
    ap.add_argument("--s3", action="store_true", help="also archive to moto's S3 (a label)")
    ap.add_argument("--skip-ceiling", action="store_true")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile run 0's archive and cold read (stderr)"
    )
    a = ap.parse_args(argv)
    if a.runs < 1 or a.mb < 1 or a.queues < 1 or a.batch < 1 or a.read_batch < 1:
        ap.error("--runs, --mb, --queues, --batch and --read-batch must be >= 1")
    if a.mb < 2 * a.file_mib:
        ap.error("--mb must be at least 2 CommitLog files (--file-mib): one sealed file at least")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    base = os.environ.get("TMPDIR") or "/tmp"
    scratch = tempfile.mkdtemp(prefix="tidemq-archive-bench-", dir=base)
    moto: MotoServer | None = None
    try:
        started, load_start = time.perf_counter(), loadavg()
        emit(
            "config",
            mb=a.mb,
            runs=a.runs,
            body_bytes=BODY_BYTES,
            body=a.body,
            batch=a.batch,
            queues=a.queues,
            read_batch=a.read_batch,
            commitlog_file_bytes=a.file_mib * MIB,
            chunk_bytes=a.chunk_mib * MIB,
            s3=a.s3,
            zstd_level=archive_config("x", a, "zstd").zstd_level,
            scratch=scratch,
            scratch_free_gib=shutil.disk_usage(scratch).free / (1 << 30),
            python=sys.version.split()[0],
            cpus=os.cpu_count(),
            loadavg=load_start,
            git=git_state(),
        )
        perfkit = os.path.abspath(a.perfkit) if a.perfkit else ""
        ceiling: Record = {}
        calib: list[Record] = []
        if perfkit and not a.skip_ceiling:
            log(f"ceiling: {perfkit}/disk.py --runs {a.runs} --skip-fio")
            ceiling = perfkit_disk(perfkit, a.runs, scratch)
            emit("ceiling.disk", **ceiling)
            calib.append(perfkit_calib(perfkit))
        if a.s3:
            for k, v in S3_ENV.items():
                os.environ.setdefault(k, v)
            moto = MotoServer(os.path.join(scratch, "moto.log"))
        runs: list[Record] = []
        for run in range(a.runs):
            r = one_run(run, a, scratch, moto)
            emit("run", run=run, **r, ratios=ratios(r))
            runs.append(r)
        if perfkit and not a.skip_ceiling:
            calib.append(perfkit_calib(perfkit))
        emit("summary", **summary(runs, ceiling, calib, a, started, load_start))
        return 0
    finally:
        if moto is not None:
            moto.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
