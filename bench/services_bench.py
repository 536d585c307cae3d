"""Services benchmark: ``tidemq bench`` against a local cluster, beside perfkit's gRPC ceilings
measured in the same run on the same machine.

usage: python bench/services_bench.py --perfkit ../shared/perfkit [--runs 3] [--messages 200000]

Per run, on 1 KiB messages:
1. a local cluster (``tidemq dev``) with ASYNC flush: ``tidemq bench produce`` (one producer
   process, the SDK's batching), ``tidemq bench consume`` (a new group reads it all back), and
   ``tidemq bench produce --unbatched`` (one message per request, one in flight: latency);
2. the same cluster restarted with SYNC flush: ``tidemq bench produce``;
3. perfkit's ``grpc_bench.py`` cases batch256_c8 (the batch ceiling) and unary_c1 (the unary
   latency ceiling) on an aio server.

Prints one JSON object per line (each measurement), and last a ``summary`` with medians, the
ratios the issue sets goals on, and one boolean per goal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

from common import (
    REPO,
    TIDEMQ,
    Process,
    emit,
    emit_summary,
    free_port,
    perfkit_grpc,
    tidemq_bench,
    wait_until,
)


class DevCluster:
    def __init__(self, data: str, flush: str) -> None:
        self.nameserver = f"127.0.0.1:{free_port()}"
        os.makedirs(data, exist_ok=True)
        self.proc = Process(
            "tidemq dev",
            [
                *TIDEMQ,
                "dev",
                "--data",
                data,
                "--flush",
                flush,
                "--nameserver-port",
                self.nameserver.rsplit(":", 1)[1],
                "--broker-port",
                str(free_port()),
                # The services goals are about one master: no slave shares its CPU here
                # (replication_bench.py measures master and slave together).
                "--slave-port",
                "0",
            ],
            os.path.join(data, f"dev-{flush}.out"),
        )
        try:
            wait_until(lambda: "cluster is up" in self.proc.output(), "tidemq dev", [self.proc])
        except BaseException:
            self.stop()
            raise

    def bench(self, *args: str) -> dict[str, Any]:
        return tidemq_bench(self.nameserver, *args)

    def stop(self) -> None:
        self.proc.stop(signal.SIGINT)


def perfkit_ceilings(perfkit: str) -> dict[str, dict[str, Any]]:
    return perfkit_grpc(perfkit, ["unary_c1", "batch256_c8"])


def one_run(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    size = ["--body-bytes", "1024"]
    data = os.path.join(scratch, f"run{run}-async")
    cluster = DevCluster(data, "ASYNC")
    try:
        p = cluster.bench("produce", "--messages", str(args.messages), *size)
        emit({**p, "bench": "produce_async", "run": run})
        c = cluster.bench("consume", "--messages", str(args.messages))
        emit({**c, "bench": "consume", "run": run})
        u = cluster.bench("produce", "--unbatched", "--messages", str(args.unbatched), *size)
        emit({**u, "bench": "produce_unbatched", "run": run})
    finally:
        cluster.stop()
    shutil.rmtree(data, ignore_errors=True)
    figures.update(
        produce_async=p["msgs_per_s"],
        consume=c["msgs_per_s"],
        unbatched_p50_us=u["p50_us"],
        unbatched_p99_us=u["p99_us"],
    )
    data = os.path.join(scratch, f"run{run}-sync")
    cluster = DevCluster(data, "SYNC")
    try:
        s = cluster.bench("produce", "--messages", str(args.messages), *size)
        emit({**s, "bench": "produce_sync", "run": run})
    finally:
        cluster.stop()
    shutil.rmtree(data, ignore_errors=True)
    figures["produce_sync"] = s["msgs_per_s"]
    ceilings = perfkit_ceilings(args.perfkit)
    for case, r in ceilings.items():
        emit({**r, "bench": f"ceiling_{case}", "run": run})
    figures["ceiling_batch_msgs_per_s"] = ceilings["batch256_c8"]["msgs_per_s"]
    figures["ceiling_unary_p50_us"] = ceilings["unary_c1"]["p50_us"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--unbatched", type=int, default=3_000)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="tidemq-services-bench-")
    try:
        runs = [one_run(i, args, scratch) for i in range(args.runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(
        runs,
        lambda r: {
            "produce_async_vs_batch_ceiling": r["produce_async"] / r["ceiling_batch_msgs_per_s"],
            "produce_sync_vs_batch_ceiling": r["produce_sync"] / r["ceiling_batch_msgs_per_s"],
            "consume_vs_produce_async": r["consume"] / r["produce_async"],
            "unbatched_p50_vs_unary_p50": r["unbatched_p50_us"] / r["ceiling_unary_p50_us"],
        },
        lambda med, ratios: {
            "produce_async_ge_70pct": ratios["produce_async_vs_batch_ceiling"] >= 0.7,
            "produce_sync_ge_50pct": ratios["produce_sync_vs_batch_ceiling"] >= 0.5,
            "consume_ge_produce": ratios["consume_vs_produce_async"] >= 1.0,
            "unbatched_p50_le_2x_unary": ratios["unbatched_p50_vs_unary_p50"] <= 2.0,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
