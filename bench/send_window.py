"""A window of sends for the RocketMQ benchmark (``rocketmq_bench.py``): at most ``size``
messages unanswered at a time, each answer's latency and outcome recorded, and the figures of a
measured run. Standard library only: both tidemq's SDK (in the benchmark's process) and the
official RocketMQ client (``rocketmq_official_producer.py``, in its own environment) send
through it, so both are loaded the same way."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

ANSWER_TIMEOUT_S = 60.0
SEND_OK = "SEND_OK"


class Window:
    def __init__(self, size: int) -> None:
        self.size = size
        self._slots = threading.Semaphore(size)
        self._lock = threading.Lock()
        self._all_answered = threading.Event()
        self._expected = self._answered = 0
        self.latencies_s: list[float] = []
        self.outcomes: Counter[str] = Counter()

    def run(self, send_async: Callable[[Any], Any], items: Sequence[Any]) -> None:
        """``send_async(item)`` for each item (a future with ``add_done_callback`` and
        ``exception``), ``size`` in flight; returns once every one is answered."""
        with self._lock:
            self._expected, self._answered = len(items), 0
            self.latencies_s = []
            self.outcomes = Counter()
            self._all_answered.clear()
        if not items:
            return
        for item in items:
            if not self._slots.acquire(timeout=ANSWER_TIMEOUT_S):
                raise TimeoutError(f"no send answered within {ANSWER_TIMEOUT_S:.0f} s")
            started = time.perf_counter()
            try:
                future = send_async(item)
            except Exception as e:  # noqa: BLE001 - counted: what the client refused at once
                self._answer(started, type(e).__name__)
                continue
            future.add_done_callback(lambda f, s=started: self._answer(s, _outcome(f)))
        if not self._all_answered.wait(ANSWER_TIMEOUT_S):
            raise TimeoutError(f"{self._expected - self._answered} sends never answered")

    def _answer(self, started: float, outcome: str) -> None:
        latency = time.perf_counter() - started
        with self._lock:
            self.latencies_s.append(latency)
            self.outcomes[outcome] += 1
            self._answered += 1
            if self._answered == self._expected:
                self._all_answered.set()
        self._slots.release()


def _outcome(future: Any) -> str:
    e = future.exception()
    return SEND_OK if e is None else type(e).__name__


def percentile_us(sorted_s: Sequence[float], pct: float) -> float:
    index = min(len(sorted_s) - 1, max(0, round(pct / 100 * len(sorted_s)) - 1))
    return round(sorted_s[index] * 1e6, 1)


def measured(
    window: Window, send_async: Callable[[Any], Any], items: Sequence[Any]
) -> dict[str, Any]:
    """One measured run through ``window``: rate, latency, this process's CPU, outcomes."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    window.run(send_async, items)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    n = len(items)
    latencies = sorted(window.latencies_s)
    return {
        "messages": n,
        "concurrency": window.size,
        "seconds": round(wall, 3),
        "msgs_per_s": round(n / wall, 1),
        "p50_us": percentile_us(latencies, 50),
        "p99_us": percentile_us(latencies, 99),
        "mean_us": round(statistics.fmean(latencies) * 1e6, 1),
        "client_cpu_pct": round(cpu / wall * 100, 1),
        "client_cpu_us_per_msg": round(cpu / n * 1e6, 2),
        "statuses": dict(window.outcomes),
    }
