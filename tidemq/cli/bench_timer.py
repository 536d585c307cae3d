"""``tidemq bench production --mode timer``: delayed messages scheduled over a window, then read
back to measure how late each became visible.

One producer schedules ``messages`` messages whose delivery times are spread evenly over
``window_s`` seconds, the window starting ``lead_s`` after the scheduling starts (by default
estimated from a warm-up so that every message is pending before the first is due: the broker's
memory after scheduling then holds all of them). After the window, a new group reads the topic
from the first message; each message's lateness is its store time in its topic (when the broker
made it visible) minus the delivery time it was sent with, carried in a property of its own so
the figure does not depend on what else the broker stamps on it. The reading starts only after
the window, so the consumer does not share the machine with the broker's firing.
"""

from __future__ import annotations

import bisect
import time
import uuid
from array import array
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from tidemq._runtime import now_ms
from tidemq.consumer import Consumer
from tidemq.errors import TidemqError
from tidemq.producer import Producer
from tidemq.producer.futures import SendFuture

Phase = Callable[[str], None]
Progress = Callable[[str, int], None]

RUN_PROPERTY = "bench_run"
SEQ_PROPERTY = "bench_seq"
DUE_PROPERTY = "bench_due_ms"
FIRST_SENDS = 1_000
WARMUP_MESSAGES = 5_000
WARMUP_DELAY_MS = 1_000
# The automatic lead: a long run's rate falls below the warm-up's (by 1.3x to 2.8x measured
# with a million on a busy machine); a run that overran its first due time says so.
LEAD_MARGIN = 2.0
LEAD_EXTRA_S = 2.0
# After the last delivery time, before the ``due`` edge (the firing of the last timers).
SETTLE_S = 1.0
# Unanswered sends at most: a send's timeout counts from its call, so a deep buffer on a
# busy machine times sends out; a few requests' worth keeps the broker busy.
UNANSWERED_SENDS = 8_192
PULL_BATCH = 256
# No new message for this long: the topic holds fewer than were scheduled (reported).
DRAINED_TIMEOUT_S = 10.0
MAX_LATENESS_SAMPLES = 10_000_000


def _percentile(sorted_values: array[int], pct: float) -> int:
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


def _sleep_until(wall_ms: int) -> None:
    ahead_s = (wall_ms - now_ms()) / 1000
    if ahead_s > 0:
        time.sleep(ahead_s)


class _Results:
    """The sends' answers, read in order as they come so the futures do not pile up."""

    def __init__(self) -> None:
        self.unread: deque[tuple[int, SendFuture]] = deque()
        self.sent = 0
        self.failed: Counter[str] = Counter()
        self.without_recall_handle = 0
        self.deliver_at_differs = 0

    def add(self, due_ms: int, future: SendFuture) -> None:
        self.unread.append((due_ms, future))
        while len(self.unread) > UNANSWERED_SENDS:
            self._read_one()

    def read_all(self) -> None:
        while self.unread:
            self._read_one()

    def _read_one(self) -> None:
        due_ms, future = self.unread.popleft()
        try:
            result = future.result()
        except TidemqError as e:  # counted and reported: the run goes on
            self.failed[e.code or type(e).__name__] += 1
            return
        self.sent += 1
        if not result.recall_handle:
            self.without_recall_handle += 1
        if result.deliver_at_ms != due_ms:
            self.deliver_at_differs += 1


def _schedule(
    producer: Producer,
    topic: str,
    body: bytes,
    run: str,
    dues: Callable[[int], int],
    count: int,
    progress: Progress,
) -> _Results:
    results = _Results()
    for i in range(count):
        due = dues(i)
        properties = {RUN_PROPERTY: run, SEQ_PROPERTY: str(i), DUE_PROPERTY: str(due)}
        results.add(due, producer.send_async(topic, body, properties=properties, deliver_at=due))
        if i % 8192 == 0:
            progress("scheduled", i)
    results.read_all()
    return results


class _Deliveries:
    """What the reader saw of this run: lateness per message, duplicates, what else it read."""

    def __init__(self, run: str, expected: int) -> None:
        self.run = run
        self.seen = bytearray(expected)
        self.unique = 0
        self.duplicates = 0
        self.other = 0
        self.lateness_ms: array[int] = array("q")

    def take(self, store_timestamp_ms: int, properties: dict[str, str]) -> None:
        if properties.get(RUN_PROPERTY) != self.run:
            self.other += 1  # the warm-up's, or an earlier run's
            return
        seq = int(properties[SEQ_PROPERTY])
        if self.seen[seq]:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.unique += 1
        self.lateness_ms.append(store_timestamp_ms - int(properties[DUE_PROPERTY]))


def _read_back(nameserver: str | None, topic: str, run: str, expected: int) -> _Deliveries:
    seen = _Deliveries(run, expected)
    with Consumer(
        nameserver,
        group=f"bench-timer-{run}",
        topic=topic,
        start_from="first",
        auto_commit=False,
        pull_batch_size=PULL_BATCH,
    ) as consumer:
        while seen.unique < expected:
            batch = consumer.poll(max_messages=1024, timeout_s=DRAINED_TIMEOUT_S)
            if not batch:
                break
            for m in batch:
                seen.take(m.store_timestamp_ms, m.properties)
    return seen


def run_timer_bench(
    nameserver: str | None,
    *,
    topic: str,
    messages: int,
    window_s: float,
    lead_s: float | None = None,
    body_bytes: int = 128,
    progress: Progress | None = None,
    on_phase: Phase | None = None,
) -> dict[str, Any]:
    """Schedule, wait out the window, read back. ``on_phase`` is called with ``schedule``
    (the warm-up's timers fired, before the first scheduled send), ``scheduled`` (every send
    answered: all pending), ``window`` (the first delivery time), ``due`` (``SETTLE_S`` after
    the last delivery time) and ``collected`` (read back)."""
    if messages <= 0 or window_s <= 0 or body_bytes < 0 or (lead_s is not None and lead_s < 0):
        raise ValueError("--messages and --window-s must be > 0, --body-bytes and --lead-s >= 0")
    if messages > MAX_LATENESS_SAMPLES:
        raise ValueError(f"--messages must be <= {MAX_LATENESS_SAMPLES}")
    phase = on_phase or (lambda edge: None)
    bar = progress or (lambda what, done: None)
    run = uuid.uuid4().hex[:12]
    body = b"x" * body_bytes
    window_ms = int(window_s * 1000)
    with Producer(nameserver, buffer_max_messages=UNANSWERED_SENDS) as producer:
        # Untimed first: the topic's creation, its route and the connection; then the rate.
        warm_due = now_ms() + WARMUP_DELAY_MS
        _schedule(producer, topic, body, f"{run}-warm", lambda i: warm_due, FIRST_SENDS, bar)
        warm = min(WARMUP_MESSAGES, messages)
        t0 = time.perf_counter()
        warm_due = now_ms() + WARMUP_DELAY_MS
        _schedule(producer, topic, body, f"{run}-warm", lambda i: warm_due, warm, bar)
        warm_rate = warm / (time.perf_counter() - t0)
        _sleep_until(warm_due + int(SETTLE_S * 1000))  # the warm-up's timers fired: not pending
        if lead_s is None:
            lead_s = messages / warm_rate * LEAD_MARGIN + LEAD_EXTRA_S
        first_due = now_ms() + int(lead_s * 1000)

        def due(i: int) -> int:
            return first_due + i * window_ms // messages

        phase("schedule")
        t0, cpu0 = time.perf_counter(), time.process_time()
        sent = _schedule(producer, topic, body, run, due, messages, bar)
        schedule_s, schedule_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        scheduled_ms = now_ms()
        phase("scheduled")
    _sleep_until(first_due)
    phase("window")
    _sleep_until(due(messages - 1) + int(SETTLE_S * 1000))
    phase("due")
    seen = _read_back(nameserver, topic, run, messages)
    phase("collected")
    late = array("q", sorted(seen.lateness_ms))
    out: dict[str, Any] = {
        "bench": "tidemq.timer",
        "messages": messages,
        "body_bytes": body_bytes,
        "window_s": window_s,
        "lead_s": round(lead_s, 3),
        "warmup_msgs_per_s": round(warm_rate, 1),
        "schedule_seconds": round(schedule_s, 3),
        "schedule_msgs_per_s": round(messages / schedule_s, 1),
        "schedule_client_cpu_us_per_msg": round(schedule_cpu / messages * 1e6, 2),
        # Sends still unanswered when the first message was due: its lateness says nothing.
        "schedule_overran_first_due_ms": max(0, scheduled_ms - first_due),
        "sent": sent.sent,
        "send_errors": dict(sent.failed),
        "without_recall_handle": sent.without_recall_handle,
        "deliver_at_differs": sent.deliver_at_differs,
        "delivered": seen.unique,
        "missing": max(0, sent.sent - seen.unique),
        "duplicates": seen.duplicates,
        "other_messages_read": seen.other,
        "early": bisect.bisect_left(late, 0),
        "complete": seen.unique == messages,
    }
    if late:
        out.update(
            lateness_min_ms=late[0],
            lateness_p50_ms=_percentile(late, 50),
            lateness_p99_ms=_percentile(late, 99),
            lateness_max_ms=late[-1],
        )
    return out
