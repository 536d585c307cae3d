"""Batches, not messages: every figure issue 22 sets a goal on, beside perfkit's ceilings measured
in the same run on the same machine.

usage: python bench/blocks_bench.py --perfkit ../shared/perfkit [--runs 3] [--messages 200000]
           [--catchup-bytes 1073741824] [--cases produce,replicate,catchup,store,floors]
           [--default-malloc]

Per run, 1 KiB bodies, one producer process (this one: the SDK's ``send_async`` batching, the
producer's default settings):
1. ``produce``: one broker (``BenchBroker``), ASYNC flush: produce msgs/s, the broker's CPU per
   message (from /proc over the measured part), the producer's CPU per message; then a new group
   consumes it all (``consume`` msgs/s); then a fresh broker with SYNC flush: produce msgs/s.
2. ``replicate``: a SYNC_MASTER and its slave, each its own process on this machine: produce
   msgs/s, the master's and the slave's CPU per message.
3. ``catchup``: an empty slave copying ``--catchup-bytes`` of CommitLog (replication_bench's case):
   MB/s from the link up (and from the slave's start), against perfkit's ``stream_1MiB``.
4. ``store``: in-process puts of producer-encoded blocks of 256 records (no gRPC, ASYNC flush):
   records/s and CPU per record, against perfkit's ``mmap_append.py`` pack+crc32 (cold pass: a
   CommitLog always writes pages nobody wrote before).
5. ``floors`` (``blocks_floors.py``): what receiving a block's bytes costs a Python gRPC server
   that does nothing with them, and what writing new pages costs, per KiB.
6. perfkit's ``grpc_bench.py`` ``batch256_c8``: msgs/s and the echo server's CPU per message;
   ``stream_1MiB``: MB/s.

Prints one JSON object per line, and last a ``summary`` with medians, the ratios the issue sets
goals on and one boolean per goal.

Every process of the run (this one, the brokers, perfkit's ceilings) runs with glibc's malloc
settings of perfkit's guide (section 5: buffers up to 8 MiB from the heap, which reuses their
pages), as the image runs its servers: the script starts itself again with them unless they are
set (``--default-malloc`` keeps glibc's defaults for all of them instead).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from common import REPO, emit, emit_summary, perfkit_grpc
from receive_broker import BenchBroker
from replication_bench import Cluster, catchup_run, fill_store
from store_ceiling import ceiling

from tidemq.cli.bench import run_consume_bench, run_produce_bench
from tidemq.protos import record_blocks
from tidemq.protos.record_blocks import encode_block
from tidemq.storage import FlushMode, MessageStore, SentBlock, StoreConfig
from tidemq.storage.record import block

TOPIC = "BlocksBench"
BODY_BYTES = 1024
STORE_BLOCK = 256
STORE_QUEUES = 8
CASES = ("produce", "replicate", "catchup", "store", "floors")
# The goals.
GOAL_BROKER_CPU_VS_ECHO = 2.0
GOAL_PRODUCE_VS_BATCH_CEILING = 0.5
GOAL_SYNC_VS_ASYNC = 0.8
GOAL_SYNC_MASTER_VS_ASYNC = 0.6
GOAL_PRODUCER_CPU_US = 2.0
GOAL_SLAVE_CPU_VS_ECHO = 2.0
GOAL_CONSUME_VS_PRODUCE = 1.5
GOAL_CATCHUP_VS_STREAM = 0.5
GOAL_STORE_VS_CEILING = 0.9


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _produce(
    nameserver: str, messages: int, pids: dict[str, int]
) -> tuple[dict[str, Any], dict[str, float]]:
    """The SDK's produce bench, with each named process's CPU over its measured part."""
    marks: dict[str, dict[str, float]] = {}

    def window(edge: str) -> None:
        marks[edge] = {name: _cpu_of(pid) for name, pid in pids.items()}

    r = run_produce_bench(
        nameserver,
        topic=TOPIC,
        messages=messages,
        body_bytes=BODY_BYTES,
        progress=False,
        on_window=window,
    )
    cpu = {n: (marks["end"][n] - marks["start"][n]) / messages * 1e6 for n in pids}
    return r, cpu


def produce_case(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for flush in ("ASYNC", "SYNC"):
        d = os.path.join(scratch, f"run{run}-{flush}")
        with BenchBroker(d, os.path.join(d, "store"), extra_args=("--flush", flush)) as broker:
            p, cpu = _produce(broker.nameserver, args.messages, {"broker": broker.pid})
            emit({**p, "bench": f"produce_{flush.lower()}", "run": run,
                  "broker_cpu_us_per_msg": round(cpu["broker"], 2)})  # fmt: skip
            out[f"produce_{flush.lower()}_msgs_per_s"] = p["msgs_per_s"]
            if flush == "ASYNC":
                out["broker_cpu_us_per_msg"] = cpu["broker"]
                out["producer_cpu_us_per_msg"] = p["client_cpu_us_per_msg"]
                c = run_consume_bench(
                    broker.nameserver, topic=TOPIC, group=f"bench-{run}",
                    messages=args.messages, progress=False,
                )  # fmt: skip
                emit({**c, "bench": "consume", "run": run})
                out["consume_msgs_per_s"] = c["msgs_per_s"]
                out["consumer_cpu_us_per_msg"] = c["client_cpu_us_per_msg"]
        shutil.rmtree(d, ignore_errors=True)
    return out


def replicate_case(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    with Cluster(scratch, f"run{run}-replicate") as cluster:
        cluster.start_master("SYNC_MASTER")
        cluster.start_slave()
        cluster.wait_in_sync()
        pids = {p.name: p.proc.pid for p in cluster.procs if p.name in ("master", "slave")}
        p, cpu = _produce(cluster.nameserver, args.messages, pids)
    emit({**p, "bench": "produce_sync_master", "run": run,
          **{f"{n}_cpu_us_per_msg": round(v, 2) for n, v in cpu.items()}})  # fmt: skip
    return {
        "sync_master_msgs_per_s": p["msgs_per_s"],
        "master_cpu_us_per_msg": cpu["master"],
        "slave_cpu_us_per_msg": cpu["slave"],
    }


def catchup_case(run: int, scratch: str, fill: str) -> dict[str, float]:
    """The slave's copying rate from its link up: before it, the slave process starts and
    opens its store (about a second here, whatever the log's size)."""
    c = catchup_run(run, scratch, fill)
    emit(c)
    return {"catchup_MBps": c["MBps_from_link_up"], "catchup_with_start_MBps": c["MBps"]}


def _blocks(queues: int, per_queue: int) -> list[SentBlock]:
    body = b"x" * BODY_BYTES
    born = (b"\x7f\x00\x00\x01", 40_000)
    blocks = []
    entry = (body, "TagA", (), None, 0)
    for q in range(queues):
        records = encode_block(TOPIC, q, [entry] * per_queue)
        blocks.append(SentBlock(TOPIC, q, records, per_queue, born))
    return blocks


def store_case(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    """Puts of blocks in this process, dispatch held off (store_append.py says why)."""
    root = os.path.join(scratch, f"run{run}-store")
    blocks = _blocks(STORE_QUEUES, STORE_BLOCK // STORE_QUEUES)
    n = args.store_messages - args.store_messages % STORE_BLOCK
    store = MessageStore(StoreConfig(root, flush_mode=FlushMode.ASYNC)).open()
    try:
        with store.dispatch_held():
            cpu0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(n // STORE_BLOCK):
                store.put_blocks(blocks)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
            end = store.log.max_offset
            d_cpu0, d0 = time.thread_time(), time.perf_counter()
            while store.dispatched_offset < end:
                store.dispatch_now()
            d_wall, d_cpu = time.perf_counter() - d0, time.thread_time() - d_cpu0
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    r = {
        "store_put_msgs_per_s": n / wall,
        "store_put_cpu_us_per_msg": cpu / n * 1e6,
        "store_dispatch_msgs_per_s": n / d_wall,
        "store_dispatch_cpu_us_per_msg": d_cpu / n * 1e6,
    }
    emit({"bench": "store_blocks", "run": run, "messages": n, **r})
    return r


def ceilings_case(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    g = perfkit_grpc(args.perfkit, ["batch256_c8", "stream_1MiB"])
    for case, r in g.items():
        emit({**r, "bench": f"ceiling_{case}", "run": run})
    out = {
        "ceiling_batch_msgs_per_s": g["batch256_c8"]["msgs_per_s"],
        "ceiling_batch_server_cpu_us_per_msg": g["batch256_c8"]["cpu_us_per_call_server"] / 256,
        "ceiling_stream_MBps": g["stream_1MiB"]["MBps"],
    }
    if "store" in args.cases:
        m = ceiling(args.perfkit, 0.25, 1, scratch)
        if m is not None and "pack_crc32_cold_recs_per_s" in m:
            emit({**m, "bench": "ceiling_mmap_append", "run": run})
            out["ceiling_pack_crc_recs_per_s"] = m["pack_crc32_cold_recs_per_s"]
    return out


def floors_case(run: int, scratch: str) -> dict[str, float]:
    """``blocks_floors.py``: receiving a block's bytes in Python gRPC, and writing new pages."""
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "blocks_floors.py"), "--dir", scratch],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    figures: dict[str, float] = {}
    for line in out.stdout.splitlines():
        r = json.loads(line)
        emit({**r, "run": run})
        if r["bench"] == "floor_grpc_bytes":
            figures["floor_grpc_server_cpu_us_per_kib"] = r["server_cpu_us_per_kib"]
        else:
            figures["floor_new_pages_cpu_us_per_kib"] = r["cpu_us_per_kib"]
    return figures


def ratios(r: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}

    def put(name: str, num: str, den: str) -> None:
        if num in r and den in r:
            out[name] = r[num] / r[den]

    put("broker_cpu_vs_echo_server", "broker_cpu_us_per_msg", "ceiling_batch_server_cpu_us_per_msg")
    put("produce_async_vs_batch_ceiling", "produce_async_msgs_per_s", "ceiling_batch_msgs_per_s")
    put("produce_sync_vs_async", "produce_sync_msgs_per_s", "produce_async_msgs_per_s")
    put("sync_master_vs_async_alone", "sync_master_msgs_per_s", "produce_async_msgs_per_s")
    put("slave_cpu_vs_echo_server", "slave_cpu_us_per_msg", "ceiling_batch_server_cpu_us_per_msg")
    put("consume_vs_produce", "consume_msgs_per_s", "produce_async_msgs_per_s")
    put("catchup_vs_stream_ceiling", "catchup_MBps", "ceiling_stream_MBps")
    put("store_put_vs_pack_crc_ceiling", "store_put_msgs_per_s", "ceiling_pack_crc_recs_per_s")
    return out


def goals(med: dict[str, float], rat: dict[str, float]) -> dict[str, bool]:
    checks: dict[str, Callable[[], bool]] = {
        "broker_cpu_le_2x_echo": lambda: rat["broker_cpu_vs_echo_server"] <= 2,
        "produce_ge_half_batch_ceiling": lambda: rat["produce_async_vs_batch_ceiling"] >= 0.5,
        "sync_ge_0_8_async": lambda: rat["produce_sync_vs_async"] >= GOAL_SYNC_VS_ASYNC,
        "sync_master_ge_0_6_async": lambda: rat["sync_master_vs_async_alone"] >= 0.6,
        "producer_cpu_le_2us": lambda: med["producer_cpu_us_per_msg"] <= GOAL_PRODUCER_CPU_US,
        "slave_cpu_le_2x_echo": lambda: rat["slave_cpu_vs_echo_server"] <= 2,
        "consume_ge_1_5x_produce": lambda: rat["consume_vs_produce"] >= 1.5,
        "catchup_ge_half_stream": lambda: rat["catchup_vs_stream_ceiling"] >= 0.5,
        "store_put_ge_0_9_ceiling": lambda: rat["store_put_vs_pack_crc_ceiling"] >= 0.9,
    }
    out = {}
    for name, check in checks.items():
        try:
            out[name] = check()
        except KeyError:  # the case was not run
            continue
    return out


MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "8388608", "MALLOC_TRIM_THRESHOLD_": "268435456"}


def main() -> int:
    if "--default-malloc" not in sys.argv and any(k not in os.environ for k in MALLOC_ENV):
        # glibc reads them at start-up: the whole run (children inherit them) starts again.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--store-messages", type=int, default=500_000)
    parser.add_argument("--catchup-bytes", type=int, default=1 << 30)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--default-malloc", action="store_true", help="glibc's malloc defaults for every process"
    )
    args = parser.parse_args()
    args.cases = set(args.cases.split(","))
    if unknown := args.cases - set(CASES):
        parser.error(f"unknown cases: {', '.join(sorted(unknown))}")
    emit(
        {
            "bench": "setup",
            "malloc": {k: os.environ.get(k, "glibc default") for k in MALLOC_ENV},
            "broker_codec": block.IMPLEMENTATION,
            "client_codec": record_blocks.IMPLEMENTATION,
        }
    )
    scratch = tempfile.mkdtemp(prefix="tidemq-blocks-bench-")
    runs = []
    try:
        fill = os.path.join(scratch, "catchup-master")
        if "catchup" in args.cases:
            emit(fill_store(fill, args.catchup_bytes))
        for run in range(args.runs):
            figures = ceilings_case(run, args, scratch)
            if "produce" in args.cases:
                figures.update(produce_case(run, args, scratch))
            if "replicate" in args.cases:
                figures.update(replicate_case(run, args, scratch))
            if "catchup" in args.cases:
                figures.update(catchup_case(run, scratch, fill))
            if "store" in args.cases:
                figures.update(store_case(run, args, scratch))
            if "floors" in args.cases:
                figures.update(floors_case(run, scratch))
            runs.append(figures)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(runs, ratios, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
