"""``tidemq bench receive``: receive-and-ack consumption rates (SimpleConsumer, PushConsumer).

The rate means something only beside offset-based consumption of the same topic in the same
run (``bench/receive_bench.py`` runs both against one broker, with the broker's CPU per message).
Modes, each one consumer process:

- ``simple``: ``SimpleConsumer`` in a plain loop: receive a batch, ``ack_many`` it, repeat;
- ``async``: ``AsyncSimpleConsumer`` with ``RECEIVES_IN_FLIGHT`` receive loops on one event
  loop, each acking its batch without waiting for the answer before it receives the next one
  (how to go fast: the broker always has a receive or an ack to work on);
- ``push``: ``PushConsumer`` with a listener that returns SUCCESS (the SDK receives ahead of
  its listeners and acks in batches);
- ``hold``: receive with a long invisible time and never ack: what in-flight state costs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidemq.consumer.push_blocking import PushConsumer
from tidemq.consumer.receive_config import PushConsumerConfig, SimpleConsumerConfig
from tidemq.consumer.simple import AsyncSimpleConsumer, SimpleConsumer
from tidemq.types import ConsumeResult, ReceivedMessage

MODES = ("simple", "async", "push", "hold")
# A batch as large as a backlog allows (the SDK's default is 16; the broker's limit 1024).
DEFAULT_BATCH = 256
# ``async``: receives in flight at once, and acks still unanswered while receiving.
RECEIVES_IN_FLIGHT = 2
ASYNC_ACKS_IN_FLIGHT = 2
# How long a receive waits for messages before the bench decides the topic is drained.
DRAINED_TIMEOUT_S = 5.0
PUSH_CONCURRENCY = 64
# Received ahead of free listeners, and asked for per receive call.
PUSH_BUFFER = 256

Progress = Callable[[int], None]
Window = Callable[[str], None]


class _Window:
    """The measured part of a run: its start's wall and CPU clocks, the CPU clock at its end,
    and the caller's ``on_window`` called at both edges."""

    def __init__(self, on_window: Window | None) -> None:
        self.on_window = on_window
        self.t0 = self.cpu0 = self.cpu1 = 0.0

    def __call__(self, edge: str) -> None:
        if self.on_window is not None:
            self.on_window(edge)
        if edge == "start":
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        else:
            self.cpu1 = time.process_time()


@dataclass
class _Tally:
    """What one run saw; ``last`` is the time the last message was completed."""

    received: int = 0
    completed: int = 0
    receive_calls: int = 0
    redelivered: int = 0
    errors: int = 0
    last: float = 0.0

    def took(self, batch: list[ReceivedMessage]) -> None:
        self.receive_calls += 1
        self.received += len(batch)
        self.redelivered += sum(1 for m in batch if m.delivery_attempt > 1)

    def done(self, n: int, errors: int = 0) -> None:
        self.completed += n - errors
        self.errors += errors
        self.last = time.perf_counter()


def _count_errors(results: object) -> int:
    """``ack_many``'s answer: one entry per message, None for done (an exception otherwise)."""
    if isinstance(results, list):
        return sum(1 for r in results if r is not None)
    return 0


def _simple_loop(
    consumer: SimpleConsumer,
    messages: int,
    batch: int,
    invisible_s: float,
    ack: bool,
    bar: Progress,
) -> _Tally:
    tally = _Tally()
    while tally.received < messages:
        want = min(batch, messages - tally.received)
        got = consumer.receive(want, invisible_s, timeout_s=DRAINED_TIMEOUT_S)
        if not got:
            break
        tally.took(got)
        if ack:
            tally.done(len(got), _count_errors(consumer.ack_many(got)))
        else:
            tally.done(len(got))
        bar(tally.completed)
    return tally


async def _async_loop(
    consumer: AsyncSimpleConsumer, messages: int, batch: int, invisible_s: float, bar: Progress
) -> _Tally:
    tally = _Tally()
    asked = 0  # messages asked for by receives in flight or answered: never more than wanted
    drained = False

    async def ack(got: list[ReceivedMessage]) -> None:
        tally.done(len(got), _count_errors(await consumer.ack_many(got)))
        bar(tally.completed)

    async def receiving() -> None:
        nonlocal asked, drained
        pending: set[asyncio.Task[None]] = set()
        while not drained and asked < messages:
            want = min(batch, messages - asked)
            asked += want
            got = await consumer.receive(want, invisible_s, timeout_s=DRAINED_TIMEOUT_S)
            asked -= want - len(got)
            if not got:
                drained = True
                break
            tally.took(got)
            pending.add(asyncio.create_task(ack(got)))
            if len(pending) >= ASYNC_ACKS_IN_FLIGHT:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            await task

    await asyncio.gather(*(receiving() for _ in range(RECEIVES_IN_FLIGHT)))
    return tally


async def _run_async(
    nameserver: str | None,
    config: SimpleConsumerConfig,
    args: tuple[str, str, int, int, float],
    bar: Progress,
    window: Window,
) -> _Tally:
    topic, group, messages, batch, invisible_s = args
    async with AsyncSimpleConsumer(group, topic, nameserver=nameserver, config=config) as c:
        window("start")
        tally = await _async_loop(c, messages, batch, invisible_s, bar)
        window("end")
    return tally


def _push(
    nameserver: str | None,
    topic: str,
    group: str,
    messages: int,
    invisible_s: float,
    bar: Progress,
    window: Window,
) -> _Tally:
    tally = _Tally()
    lock = threading.Lock()
    all_done = threading.Event()

    def listener(message: ReceivedMessage) -> ConsumeResult:
        with lock:
            tally.received += 1
            if message.delivery_attempt > 1:
                tally.redelivered += 1
            tally.done(1)
            if tally.completed % 1024 == 0:
                bar(tally.completed)
            if tally.completed >= messages:
                all_done.set()
        return ConsumeResult.SUCCESS

    config = PushConsumerConfig(
        max_concurrency=PUSH_CONCURRENCY,
        buffer_messages=PUSH_BUFFER,
        receive_batch_size=PUSH_BUFFER,
        invisible_duration_s=invisible_s,
        start_from="first",
    )
    window("start")
    consumer = PushConsumer(group, topic, listener, nameserver=nameserver, config=config)
    try:
        # No new message for this long: the topic holds fewer than asked (reported as such).
        seen = -1
        while not all_done.wait(DRAINED_TIMEOUT_S):
            with lock:
                if tally.completed == seen:
                    break
                seen = tally.completed
    finally:
        # The acks still batched go out here: the run ends when they are answered.
        consumer.close()
    tally.errors = consumer.stats.ack_errors
    tally.receive_calls = consumer.stats.receive_calls
    if tally.completed:
        tally.last = time.perf_counter()
    window("end")
    return tally


def run_receive_bench(
    nameserver: str | None,
    *,
    topic: str,
    group: str,
    messages: int,
    mode: str = "simple",
    batch: int = DEFAULT_BATCH,
    invisible_s: float = 60.0,
    progress: Progress | None = None,
    on_window: Window | None = None,
) -> dict[str, Any]:
    """Consume ``messages`` messages of ``topic`` with a new receive ``group`` from the first
    message on. ``on_window("start")`` and ``on_window("end")`` are called around the measured
    part (after the consumer is built; ``end`` once every ack is answered)."""
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}")
    if messages <= 0 or batch <= 0 or invisible_s <= 0:
        raise ValueError("--messages, --batch and --invisible-s must be > 0")
    bar = progress or (lambda done: None)
    window = _Window(on_window)
    if mode == "push":
        tally = _push(nameserver, topic, group, messages, invisible_s, bar, window)
    else:
        config = SimpleConsumerConfig(start_from="first")
        if mode == "async":
            args = (topic, group, messages, batch, invisible_s)
            tally = asyncio.run(_run_async(nameserver, config, args, bar, window))
        else:
            with SimpleConsumer(group, topic, nameserver=nameserver, config=config) as c:
                window("start")
                tally = _simple_loop(c, messages, batch, invisible_s, mode != "hold", bar)
                window("end")
    wall = tally.last - window.t0 if tally.last else 0.0
    cpu = window.cpu1 - window.cpu0
    done = tally.completed
    return {
        "bench": "tidemq.receive",
        "mode": mode,
        "messages": done,
        "received": tally.received,
        "batch": batch,
        "seconds": round(wall, 3),
        "msgs_per_s": round(done / wall, 1) if wall > 0 else 0.0,
        "client_cpu_pct": round(cpu / wall * 100, 1) if wall > 0 else 0.0,
        "client_cpu_us_per_msg": round(cpu / done * 1e6, 2) if done else 0.0,
        "receive_calls": tally.receive_calls,
        "messages_per_receive": round(tally.received / tally.receive_calls, 1)
        if tally.receive_calls
        else 0.0,
        "redelivered": tally.redelivered,
        "ack_errors": tally.errors,
        "acked": mode != "hold",
        "complete": done >= messages,
    }
