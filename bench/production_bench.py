"""Production-semantics benchmark: idempotent beside plain produce, transactional send + commit,
and a million delayed messages (delivery lateness, broker memory), each with the broker's CPU per
message, beside perfkit's gRPC ceilings measured in the same run.

usage: python bench/production_bench.py --perfkit ../shared/perfkit [--runs 3] [--messages 100000]
           [--transactions 5000] [--concurrency 16] [--timer-messages 1000000] [--window-s 60]
           [--lead-s S] [--timer-body-bytes 128]

One broker (ASYNC flush, no slave: the goals are about one broker and one client process). Per
run, in this process (one producer process), on 1 KiB messages:
1. ``plain`` and ``idempotent`` (the order alternates between runs): ``tidemq bench production
   --mode plain|idempotent``'s loop, ``--messages`` messages each to a topic of its own, the
   SDK's batching, idempotence off / on; msgs/s, the broker's and this process's CPU per message,
   and whether the topic holds exactly what was sent (``stored_as_sent``);
2. ``transactions``: ``--transactions`` transactions of one message, ``--concurrency`` at once,
   each begin, send (a half message), commit; transactions/s, p50/p99 of one, the broker's CPU
   per transaction, whether the topic holds every committed message and nothing is left open;
3. perfkit's ``grpc_bench.py`` cases batch256_c8 (the produce ceiling: 256 x 1 KiB per call, 8
   in flight) and unary_c64 (a transaction is two unary calls: send and end; 64 in flight) on an
   aio server (skipped with ``--perfkit ''``).
Then once, on a broker of its own (its heap holds nothing of the runs): ``tidemq bench
production --mode timer``'s loop: ``--timer-messages`` messages (128-byte bodies: a pending
timer's cost does not depend on its body) whose delivery times are spread evenly over
``--window-s`` seconds, the window starting once all are scheduled (``--lead-s``, estimated from
a warm-up by default); the broker's RssAnon (its heap; the store's and the timer wheel's mapped
files are RssFile) before scheduling, with everything pending, and after delivery; its CPU per
message scheduling and firing; then the topic read back: each message's lateness (its store time
in its topic minus its delivery time), p50/p99/max, and any delivered early, twice, or never.

Prints one JSON object per line, and last a ``summary``: medians, the ratios (idempotent to
plain, goal >= 0.9; each to its ceiling), the timer's figures and one boolean per goal (p99
lateness <= 1 s; heap growth <= 64 MiB per million pending; every timer delivered once, none
early).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from typing import Any

import grpc
from common import REPO, emit, emit_summary, free_port, perfkit_grpc
from receive_broker import STATUS_TIMEOUT_S, BenchBroker

from tidemq.cli.bench import run_produce_bench
from tidemq.cli.bench_timer import run_timer_bench
from tidemq.cli.bench_transactions import run_transaction_bench
from tidemq.protos import broker_pb2

BROKER_NAME = "bench-production"
TIMER_TOPIC = "BenchTimer"
PENDING_GAUGE = "tidemq_timer_pending"
TXN_TOPIC = "BenchTransactions"
IDEMPOTENT_VS_PLAIN_GOAL = 0.9
LATENESS_P99_GOAL_MS = 1_000
PENDING_MEMORY_GOAL_BYTES = 64 << 20  # per million pending
MILLION = 1_000_000
CEILINGS = ("batch256_c8", "unary_c64")
# A transaction is two unary calls: the half message's send and its end.
CALLS_PER_TRANSACTION = 2
# Every SDK produce bench sends this many first (tidemq.cli.bench.WARMUP_MESSAGES).
PRODUCE_WARMUP = 2_000


class Edges:
    """The broker's CPU seconds, RssAnon / VmRSS and (a ``TimerBroker``'s) pending timers at
    named moments."""

    def __init__(self, broker: BenchBroker) -> None:
        self.broker = broker
        self.at: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.rss: dict[str, dict[str, int]] = {}
        self.pending: dict[str, int] = {}

    def __call__(self, edge: str) -> None:
        self.at[edge] = time.monotonic()
        self.cpu[edge] = self.broker.cpu_s()
        self.rss[edge] = self.broker.rss()
        if isinstance(self.broker, TimerBroker):
            self.pending[edge] = self.broker.pending_timers()

    def cpu_us_per(self, start: str, end: str, count: int) -> float:
        return round((self.cpu[end] - self.cpu[start]) / count * 1e6, 2) if count else 0.0


class TimerBroker(BenchBroker):
    """A bench broker serving /metrics: the pending count is its ``tidemq_timer_pending`` gauge
    (ListDelayedMessages reads every pending entry: with a million pending it would stall the
    broker it measures)."""

    def __init__(self, directory: str, store: str) -> None:
        self.metrics = f"127.0.0.1:{free_port()}"
        super().__init__(
            directory,
            store,
            broker_name=BROKER_NAME,
            extra_args=("--metrics-listen", self.metrics),
        )

    def pending_timers(self) -> int:
        url = f"http://{self.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=STATUS_TIMEOUT_S) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(PENDING_GAUGE + " "):
                return int(float(line.split()[1]))
        raise RuntimeError(f"{PENDING_GAUGE} not in the broker's /metrics")


def open_transactions(broker: BenchBroker) -> int:
    r = broker.stub.ListTransactions(
        broker_pb2.ListTransactionsRequest(limit=1), timeout=STATUS_TIMEOUT_S
    )
    return int(r.total)


def topic_messages(broker: BenchBroker, topic: str) -> int:
    """What the topic holds (0 before its first message created it)."""
    try:
        return broker.topic_messages(topic)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return 0
        raise


def produce(
    broker: BenchBroker, run: int, idempotent: bool, messages: int, body_bytes: int
) -> dict[str, Any]:
    name = "idempotent" if idempotent else "plain"
    topic = f"BenchProduce{name.capitalize()}"
    before = topic_messages(broker, topic)
    edges = Edges(broker)
    p = run_produce_bench(
        broker.nameserver,
        topic=topic,
        messages=messages,
        body_bytes=body_bytes,
        progress=False,
        producer_settings={"idempotent": idempotent},
        on_window=edges,
    )
    stored = topic_messages(broker, topic) - before
    return {
        **p,
        "bench": name,
        "run": run,
        "broker_cpu_us_per_msg": edges.cpu_us_per("start", "end", messages),
        "stored": stored,
        "stored_as_sent": stored == messages + min(PRODUCE_WARMUP, messages),
    }


def transactions(broker: BenchBroker, run: int, count: int, concurrency: int) -> dict[str, Any]:
    before = topic_messages(broker, TXN_TOPIC)
    edges = Edges(broker)
    t = run_transaction_bench(
        broker.nameserver,
        topic=TXN_TOPIC,
        transactions=count,
        concurrency=concurrency,
        on_window=edges,
    )
    stored = topic_messages(broker, TXN_TOPIC) - before
    return {
        **t,
        "bench": "transactions",
        "run": run,
        "broker_cpu_us_per_txn": edges.cpu_us_per("start", "end", t["committed"]),
        "stored": stored,
        "stored_as_committed": stored == t["committed"] + t["warmup_committed"],
        "left_open": open_transactions(broker),
    }


def one_run(run: int, broker: BenchBroker, args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    order = [False, True] if run % 2 == 0 else [True, False]  # neither always goes first
    for idempotent in order:
        r = produce(broker, run, idempotent, args.messages, args.body_bytes)
        emit(r)
        name = r["bench"]
        figures[f"{name}_msgs_per_s"] = r["msgs_per_s"]
        figures[f"{name}_broker_cpu_us"] = r["broker_cpu_us_per_msg"]
        figures[f"{name}_client_cpu_us"] = r["client_cpu_us_per_msg"]
    t = transactions(broker, run, args.transactions, args.concurrency)
    emit(t)
    figures.update(
        txn_per_s=t["txn_per_s"],
        txn_p50_ms=t.get("p50_ms", 0.0),
        txn_broker_cpu_us=t["broker_cpu_us_per_txn"],
        txn_client_cpu_us=t["client_cpu_us_per_txn"],
    )
    if args.perfkit:
        ceilings = perfkit_grpc(args.perfkit, CEILINGS)
        for case, c in ceilings.items():
            emit({**c, "bench": f"ceiling_{case}", "run": run})
        batch, unary = ceilings["batch256_c8"], ceilings["unary_c64"]
        figures.update(
            ceiling_batch_msgs_per_s=batch["msgs_per_s"],
            ceiling_batch_server_cpu_us_per_msg=batch["cpu_us_per_call_server"] / 256,
            ceiling_unary_calls_per_s=unary["calls_per_s"],
            ceiling_unary_server_cpu_us_per_call=unary["cpu_us_per_call_server"],
        )
    return figures


def timer(scratch: str, args: argparse.Namespace) -> dict[str, Any]:
    with TimerBroker(os.path.join(scratch, "timer"), os.path.join(scratch, "tstore")) as broker:
        edges = Edges(broker)
        t = run_timer_bench(
            broker.nameserver,
            topic=TIMER_TOPIC,
            messages=args.timer_messages,
            window_s=args.window_s,
            lead_s=args.lead_s,
            body_bytes=args.timer_body_bytes,
            on_phase=edges,
        )
    n = args.timer_messages
    rss = edges.rss
    fired = edges.pending["window"] - edges.pending["due"]
    growth = rss["scheduled"]["RssAnon"] - rss["schedule"]["RssAnon"]
    return {
        **t,
        "bench": "timer",
        "pending_when_scheduled": edges.pending["scheduled"],
        "pending_when_window": edges.pending["window"],
        "pending_when_due": edges.pending["due"],
        "rss_anon_before_bytes": rss["schedule"]["RssAnon"],
        "rss_anon_pending_bytes": rss["scheduled"]["RssAnon"],
        "rss_anon_delivered_bytes": rss["due"]["RssAnon"],
        "rss_anon_growth_bytes": growth,
        "rss_anon_bytes_per_million_pending": round(growth / n * MILLION),
        "extrapolated_to_million": n != MILLION,
        "vm_rss_growth_bytes": rss["scheduled"]["VmRSS"] - rss["schedule"]["VmRSS"],
        "rss_file_pending_bytes": rss["scheduled"]["RssFile"],
        "broker_schedule_cpu_us_per_msg": edges.cpu_us_per("schedule", "scheduled", n),
        # Per message fired over the window (with the delivery behind, fewer than n).
        "fired_in_window": fired,
        "fire_msgs_per_s": round(fired / (edges.at["due"] - edges.at["window"]), 1),
        "broker_fire_cpu_us_per_msg": edges.cpu_us_per("window", "due", fired),
    }


def ratios(r: dict[str, float]) -> dict[str, float]:
    out = {"idempotent_vs_plain": r["idempotent_msgs_per_s"] / r["plain_msgs_per_s"]}
    if "ceiling_batch_msgs_per_s" in r:
        out["plain_vs_batch_ceiling"] = r["plain_msgs_per_s"] / r["ceiling_batch_msgs_per_s"]
        out["idempotent_vs_batch_ceiling"] = (
            r["idempotent_msgs_per_s"] / r["ceiling_batch_msgs_per_s"]
        )
        out["txn_calls_vs_unary_ceiling"] = (
            r["txn_per_s"] * CALLS_PER_TRANSACTION / r["ceiling_unary_calls_per_s"]
        )
    return out


def goals(t: dict[str, Any]) -> dict[str, bool]:
    """The timer's goals; a lateness says nothing when scheduling overran the first due time."""
    return {
        "timer_p99_le_1s": t.get("lateness_p99_ms", LATENESS_P99_GOAL_MS + 1)
        <= LATENESS_P99_GOAL_MS
        and t["schedule_overran_first_due_ms"] == 0,
        "timer_heap_le_64MiB_per_million_pending": t["rss_anon_bytes_per_million_pending"]
        <= PENDING_MEMORY_GOAL_BYTES,
        "timer_each_delivered_once_none_early": (t["missing"], t["duplicates"], t["early"])
        == (0, 0, 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--transactions", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--timer-messages", type=int, default=MILLION)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--lead-s", type=float)
    parser.add_argument("--timer-body-bytes", type=int, default=128)
    args = parser.parse_args()
    counts = (args.runs, args.messages, args.transactions, args.concurrency, args.timer_messages)
    if min(counts) < 1 or args.window_s <= 0:
        parser.error(
            "--runs, --messages, --transactions, --concurrency, --timer-messages >= 1 and "
            "--window-s > 0"
        )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = tempfile.mkdtemp(prefix="tidemq-production-bench-")
    try:
        with BenchBroker(
            os.path.join(scratch, "runs"), os.path.join(scratch, "store"), broker_name=BROKER_NAME
        ) as broker:
            runs = [one_run(i, broker, args) for i in range(args.runs)]
        t = timer(scratch, args)
        emit(t)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(
        runs,
        ratios,
        lambda med, r: {
            "idempotent_ge_90pct_plain": r["idempotent_vs_plain"] >= IDEMPOTENT_VS_PLAIN_GOAL,
            **goals(t),
        },
        reported={
            f"timer_{k}": t.get(k)
            for k in (
                "messages",
                "window_s",
                "schedule_msgs_per_s",
                "schedule_overran_first_due_ms",
                "lateness_p50_ms",
                "lateness_p99_ms",
                "lateness_max_ms",
                "early",
                "missing",
                "duplicates",
                "rss_anon_bytes_per_million_pending",
                "extrapolated_to_million",
                "broker_schedule_cpu_us_per_msg",
                "fire_msgs_per_s",
                "broker_fire_cpu_us_per_msg",
            )
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
