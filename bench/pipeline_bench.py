"""Spark pipeline benchmark: the ``tidemq`` source's batch read and the CommitLog audit job,
each beside its ceiling measured in the same run on the same data.

usage: python bench/pipeline_bench.py [--runs 3] [--messages 200000] [--audit-records 960000]

Per run:
1. a local cluster (``tidemq dev``, one master), a topic of 4 queues, ``--messages`` 1 KiB
   messages sent with ``tidemq bench produce``;
2. ``tidemq bench consume`` of the whole topic (one SDK consumer process): the ceiling;
3. a Spark batch read of the same topic on local[2] (``format("tidemq")``, every column
   materialized by the ``noop`` sink), after one warm-up query so the JVM and the Python workers
   are started: goal >= 50% of the consume rate;
4. a store of ``--audit-records`` 1 KiB messages written with ``tidemq store put`` (its first
   CommitLog segment is then full: 1 GiB), audited by ``tidemq.pipeline.jobs.audit`` (64 MiB
   splits), beside a plain sequential read of the same file (8 MiB reads, the page cache warm
   for both).

Prints one JSON object per line, and last a ``summary`` with medians, ratios and goals.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from common import REPO, TIDEMQ, emit, emit_summary
from services_bench import DevCluster

TOPIC = "bench-spark"
SEGMENT = "00000000000000000000"
READ_BYTES = 8 << 20


def sequential_read(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(READ_BYTES):
            n += len(chunk)
    wall = time.perf_counter() - t0
    return {"bench": "ceiling_sequential_read", "bytes": n, "MBps": round(n / wall / 1e6, 1)}


def spark_read(spark: Any, nameserver: str, messages: int) -> dict[str, Any]:
    def df() -> Any:
        return (
            spark.read.format("tidemq")
            .option("nameserver", nameserver)
            .option("topic", TOPIC)
            .load()
        )

    df().limit(10).collect()  # warm-up: JVM code paths, Python workers, channels
    t0 = time.perf_counter()
    df().write.format("noop").mode("overwrite").save()
    wall = time.perf_counter() - t0
    return {
        "bench": "spark_batch_read",
        "messages": messages,
        "seconds": round(wall, 3),
        "msgs_per_s": round(messages / wall, 1),
    }


def audit_run(spark: Any, scratch: str, records: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from tidemq.pipeline.jobs.audit import audit  # noqa: PLC0415 - pyspark only once the venv has it

    store = os.path.join(scratch, "store")
    subprocess.run(
        [*TIDEMQ, "store", "put", store, "--topic", "audit", "--count", str(records)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    segment = os.path.join(store, "commitlog", SEGMENT)
    if not os.path.exists(os.path.join(store, "commitlog", f"{1 << 30:020d}")):
        raise RuntimeError(f"{records} records did not fill the first 1 GiB segment")
    ceiling = sequential_read(segment)  # also brings the file into the page cache
    t0 = time.perf_counter()
    summary = audit(spark, [segment], os.path.join(scratch, "audit"), split_bytes=64 << 20)
    wall = time.perf_counter() - t0
    size = os.path.getsize(segment)
    result = {
        "bench": "audit",
        "bytes": size,
        "records": summary["records"],
        "ok": summary["ok"],
        "seconds": round(wall, 3),
        "MBps": round(size / wall / 1e6, 1),
    }
    return result, ceiling


def one_run(run: int, args: argparse.Namespace, scratch: str, spark: Any) -> dict[str, float]:
    import tidemq  # noqa: PLC0415 - run from the repo root like the other benchmarks

    data = os.path.join(scratch, f"run{run}")
    cluster = DevCluster(data, "ASYNC")
    try:
        with tidemq.Admin(cluster.nameserver) as admin:
            admin.create_topic(TOPIC, queues=4)
        p = cluster.bench(
            "produce", "--topic", TOPIC, "--messages", str(args.messages), "--body-bytes", "1024"
        )
        emit({**p, "bench": "produce", "run": run})
        c = cluster.bench("consume", "--topic", TOPIC, "--messages", str(args.messages))
        emit({**c, "bench": "ceiling_tidemq_consume", "run": run})
        # tidemq bench produce sends a few warm-up messages before it measures.
        with tidemq.Admin(cluster.nameserver) as admin:
            total = sum(q.max_offset for q in admin.queue_status(TOPIC))
        s = spark_read(spark, cluster.nameserver, total)
        emit({**s, "run": run})
    finally:
        cluster.stop()
    shutil.rmtree(data, ignore_errors=True)
    a, ceiling = audit_run(spark, os.path.join(scratch, f"audit{run}"), args.audit_records)
    emit({**a, "run": run})
    emit({**ceiling, "run": run})
    shutil.rmtree(os.path.join(scratch, f"audit{run}"), ignore_errors=True)
    return {
        "spark_read_msgs_per_s": s["msgs_per_s"],
        "consume_msgs_per_s": c["msgs_per_s"],
        "audit_MBps": a["MBps"],
        "sequential_read_MBps": ceiling["MBps"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--audit-records", type=int, default=960_000)
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from tidemq.pipeline.session import get_session  # noqa: PLC0415

    spark = get_session("tidemq-pipeline-bench", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    scratch = tempfile.mkdtemp(prefix="tidemq-pipeline-bench-")
    try:
        runs = [one_run(i, args, scratch, spark) for i in range(args.runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()
    emit_summary(
        runs,
        lambda r: {
            "spark_read_vs_consume": r["spark_read_msgs_per_s"] / r["consume_msgs_per_s"],
            "audit_vs_sequential_read": r["audit_MBps"] / r["sequential_read_MBps"],
        },
        lambda med, ratios: {
            "spark_read_ge_50pct_of_consume": ratios["spark_read_vs_consume"] >= 0.5
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
