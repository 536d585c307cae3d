"""``tidemq bench production --mode transactions``: transactional send + commit throughput.

``concurrency`` threads share one producer; each runs transactions one after another: begin,
send one message (the broker stores it as a half message), commit (the broker puts the real
message), each step answered once durable. A transaction's time is from its begin to its
commit's answer. The producer's checker counts the checks it is asked (none are expected: every
transaction is committed long before the broker's transaction timeout) and answers COMMIT.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from itertools import count
from typing import Any

from tidemq import TransactionChecker, TransactionResolution
from tidemq.producer import Producer
from tidemq.types import ReceivedMessage

Progress = Callable[[str, int], None]
Window = Callable[[str], None]

WARMUP_TRANSACTIONS = 200


class _CountingChecker(TransactionChecker):
    def __init__(self) -> None:
        self.checks = 0

    def check(self, message: ReceivedMessage) -> TransactionResolution:
        self.checks += 1
        return TransactionResolution.COMMIT


def _percentile(sorted_values: list[float], pct: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


class _Workers:
    """``concurrency`` threads taking transaction numbers from one counter until ``total``."""

    def __init__(self, producer: Producer, topic: str, body: bytes) -> None:
        self.producer, self.topic, self.body = producer, topic, body
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.committed = 0
        self.lock = threading.Lock()

    def one(self) -> None:
        t = time.perf_counter()
        try:
            tx = self.producer.begin_transaction()
            tx.send(self.topic, self.body)
            tx.commit()
        except Exception as e:  # noqa: BLE001 - counted by type and reported, the run goes on
            with self.lock:
                self.errors[type(e).__name__] += 1
            return
        took = time.perf_counter() - t
        with self.lock:
            self.latencies.append(took)
            self.committed += 1

    def run(self, total: int, concurrency: int, progress: Progress) -> None:
        numbers = count()

        def work() -> None:
            while (i := next(numbers)) < total:
                self.one()
                if i % 256 == 0:
                    progress("committed", i)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def run_transaction_bench(
    nameserver: str | None,
    *,
    topic: str,
    transactions: int,
    body_bytes: int = 1024,
    concurrency: int = 16,
    group: str | None = None,
    progress: Progress | None = None,
    on_window: Window | None = None,
) -> dict[str, Any]:
    """``on_window("start")`` and ``on_window("end")`` are called around the measured part
    (after the warm-up's transactions)."""
    if transactions <= 0 or body_bytes < 0 or concurrency <= 0:
        raise ValueError("--messages and --concurrency must be > 0 and --body-bytes >= 0")
    bar = progress or (lambda what, done: None)
    checker = _CountingChecker()
    body = b"x" * body_bytes
    group = group or f"bench-txn-{uuid.uuid4().hex[:8]}"
    with Producer(nameserver, group=group, transaction_checker=checker) as producer:
        warm = _Workers(producer, topic, body)
        warm.run(min(WARMUP_TRANSACTIONS, transactions), concurrency, bar)
        workers = _Workers(producer, topic, body)
        if on_window is not None:
            on_window("start")
        t0, cpu0 = time.perf_counter(), time.process_time()
        workers.run(transactions, concurrency, bar)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if on_window is not None:
            on_window("end")
    done = workers.committed
    lat = sorted(workers.latencies)
    out: dict[str, Any] = {
        "bench": "tidemq.transactions",
        "transactions": transactions,
        "committed": done,
        "warmup_committed": warm.committed,
        "concurrency": concurrency,
        "body_bytes": body_bytes,
        "seconds": round(wall, 3),
        "txn_per_s": round(done / wall, 1) if wall > 0 else 0.0,
        "client_cpu_us_per_txn": round(cpu / done * 1e6, 2) if done else 0.0,
        "errors": dict(workers.errors + warm.errors),
        "checks_received": checker.checks,
        "complete": done == transactions,
    }
    if lat:
        out["p50_ms"] = round(statistics.median(lat) * 1e3, 2)
        out["p99_ms"] = round(_percentile(lat, 99) * 1e3, 2)
    return out
