"""``tidemq bench``: produce, consume and receive-and-ack rates against a running cluster, as
JSON (the receive loops are in ``bench_receive``), and those of production semantics (delayed
messages in ``bench_timer``, transactions in ``bench_transactions``).

The figures mean something only beside a ceiling measured in the same run on the same machine
(``bench/services_bench.py`` runs these next to perfkit's gRPC ceilings, and
``bench/receive_bench.py`` receive-and-ack next to offset-based consumption).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tidemq.cli.bench_receive import DEFAULT_BATCH, MODES, run_receive_bench
from tidemq.cli.bench_timer import run_timer_bench
from tidemq.cli.bench_transactions import run_transaction_bench
from tidemq.cli.common import add_nameserver
from tidemq.consumer import Consumer
from tidemq.producer import Producer

WARMUP_MESSAGES = 2_000
# Pull batches larger than the SDK's default (32): a consumer catching up on a backlog.
BENCH_PULL_BATCH = 1024


class _Progress:
    def __init__(self, what: str, total: int, enabled: bool) -> None:
        self.what, self.total, self.enabled = what, total, enabled
        self.started = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if self.enabled and now - self.last >= 1.0:
            self.last = now
            rate = done / (now - self.started)
            print(
                f"{self.what} {done}/{self.total} ({rate:,.0f} msgs/s)",
                file=sys.stderr,
                flush=True,
            )


class _Pacer:
    """Holds a sending loop to ``rate`` messages per second; ``None`` sends as fast as it can."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.restart()

    def restart(self) -> None:
        self.t0 = time.perf_counter()

    def before(self, i: int) -> None:
        """Sleep until message ``i`` (counted from the last restart) is due."""
        if self.rate is None:
            return
        ahead = self.t0 + i / self.rate - time.perf_counter()
        if ahead > 0.001:  # sleep in steps of a millisecond or more, not per message
            time.sleep(ahead)


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


def run_produce_bench(
    nameserver: str | None,
    *,
    topic: str,
    messages: int,
    body_bytes: int,
    unbatched: bool = False,
    progress: bool = True,
    rate: float | None = None,
    producer_settings: Mapping[str, Any] | None = None,
    on_window: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``rate``: messages per second to send at, warm-up included (None: as fast as possible).
    ``producer_settings``: more ``ProducerConfig`` settings. ``on_window("start")`` and
    ``on_window("end")`` are called around the measured part (after the warm-up)."""
    if messages <= 0 or body_bytes < 0:
        raise ValueError("--messages must be > 0 and --body-bytes >= 0")
    if rate is not None and rate <= 0:
        raise ValueError("--rate must be > 0")
    body = b"x" * body_bytes
    settings: dict[str, Any] = dict(producer_settings or {})
    if unbatched:
        settings.update(batch_max_messages=1, max_in_flight_per_broker=1)
    with Producer(nameserver, **settings) as producer:
        pace = _Pacer(rate)
        warmup = []
        for i in range(min(WARMUP_MESSAGES, messages)):
            pace.before(i)
            warmup.append(producer.send_async(topic, body))
        for f in warmup:
            f.result()
        warm = producer.stats.requests, producer.stats.messages
        statuses: Counter[str] = Counter()
        bar = _Progress("produced", messages, progress)
        if on_window is not None:
            on_window("start")
        cpu0, t0 = time.process_time(), time.perf_counter()
        latencies: list[float] = []
        pace.restart()
        if unbatched:
            for i in range(messages):
                pace.before(i)
                t = time.perf_counter()
                r = producer.send(topic, body)
                latencies.append(time.perf_counter() - t)
                statuses[r.status.value] += 1
                if i % 256 == 0:
                    bar.update(i)
        else:
            futures: list[Any] = []
            send, keep = producer.send_async, futures.append
            # Chunks of 4096 between progress lines (and pacing checks), so that the loop
            # around each send costs as little of the producer's measured CPU as it can.
            for start in range(0, messages, 4096):
                for i in range(start, min(messages, start + 4096)):
                    if rate is not None:
                        pace.before(i)
                    keep(send(topic, body))
                bar.update(start)
            for status, n in Counter(f.result().status for f in futures).items():
                statuses[status.value] += n
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        if on_window is not None:
            on_window("end")
        requests = producer.stats.requests - warm[0]
        sent = producer.stats.messages - warm[1]
    out: dict[str, Any] = {
        "bench": "tidemq.produce",
        "mode": "unbatched" if unbatched else "batched",
        "messages": messages,
        "body_bytes": body_bytes,
        "seconds": round(wall, 3),
        "msgs_per_s": round(messages / wall, 1),
        "MBps": round(messages * body_bytes / wall / 1e6, 2),
        "client_cpu_pct": round(cpu / wall * 100, 1),
        "client_cpu_us_per_msg": round(cpu / messages * 1e6, 2),
        "requests": requests,
        "messages_per_request": round(sent / requests, 1) if requests else 0,
        "statuses": dict(statuses),
    }
    if rate is not None:
        out["target_rate"] = rate
    if latencies:
        latencies.sort()
        out["p50_us"] = round(statistics.median(latencies) * 1e6, 1)
        out["p99_us"] = round(_percentile(latencies, 99) * 1e6, 1)
    return out


def run_consume_bench(
    nameserver: str | None,
    *,
    topic: str,
    group: str,
    messages: int,
    progress: bool = True,
    on_window: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``on_window("start")`` and ``on_window("end")`` are called around the measured part."""
    if messages <= 0:
        raise ValueError("--messages must be > 0")
    with Consumer(
        nameserver,
        group=group,
        topic=topic,
        start_from="first",
        auto_commit=False,
        pull_batch_size=BENCH_PULL_BATCH,
    ) as consumer:
        got = 0
        bar = _Progress("consumed", messages, progress)
        if on_window is not None:
            on_window("start")
        cpu0, t0 = time.process_time(), time.perf_counter()
        last = t0
        while got < messages:
            batch = consumer.poll(max_messages=1024, timeout_s=10.0)
            if not batch:
                break  # the topic holds fewer messages than asked for: report what was read
            got += len(batch)
            last = time.perf_counter()
            bar.update(got)
        wall = last - t0  # not counting the final wait for messages that never came
        cpu = time.process_time() - cpu0
        if on_window is not None:
            on_window("end")
    return {
        "bench": "tidemq.consume",
        "messages": got,
        "seconds": round(wall, 3),
        "msgs_per_s": round(got / wall, 1) if wall else 0.0,
        "client_cpu_pct": round(cpu / wall * 100, 1) if wall else 0.0,
        "client_cpu_us_per_msg": round(cpu / got * 1e6, 2) if got else 0.0,
        "complete": got >= messages,
    }


def cmd_bench_produce(args: argparse.Namespace) -> int:
    result = run_produce_bench(
        args.nameserver,
        topic=args.topic,
        messages=args.messages,
        body_bytes=args.body_bytes,
        unbatched=args.unbatched,
        progress=not args.json,
        rate=args.rate,
    )
    print(json.dumps(result))
    return 0


def cmd_bench_consume(args: argparse.Namespace) -> int:
    result = run_consume_bench(
        args.nameserver,
        topic=args.topic,
        group=args.group or f"bench-{uuid.uuid4().hex[:8]}",
        messages=args.messages,
        progress=not args.json,
    )
    print(json.dumps(result))
    return 0


def cmd_bench_receive(args: argparse.Namespace) -> int:
    bar = _Progress("received and acked", args.messages, not args.json)
    result = run_receive_bench(
        args.nameserver,
        topic=args.topic,
        group=args.group or f"bench-{uuid.uuid4().hex[:8]}",
        messages=args.messages,
        mode=args.mode,
        batch=args.batch,
        invisible_s=args.invisible_s,
        progress=bar.update,
    )
    print(json.dumps(result))
    return 0


PRODUCTION_MODES = ("timer", "plain", "idempotent", "transactions")


def cmd_bench_production(args: argparse.Namespace) -> int:
    bar = _Progress(args.mode, args.messages, not args.json)

    def progress(what: str, done: int) -> None:
        bar.what = what
        bar.update(done)

    topic = args.topic or f"Bench{args.mode.capitalize()}"
    if args.mode == "timer":
        result = run_timer_bench(
            args.nameserver,
            topic=topic,
            messages=args.messages,
            window_s=args.window_s,
            lead_s=args.lead_s,
            body_bytes=args.body_bytes,
            progress=progress,
        )
    elif args.mode == "transactions":
        result = run_transaction_bench(
            args.nameserver,
            topic=topic,
            transactions=args.messages,
            body_bytes=args.body_bytes,
            concurrency=args.concurrency,
            progress=progress,
        )
    else:
        result = run_produce_bench(
            args.nameserver,
            topic=topic,
            messages=args.messages,
            body_bytes=args.body_bytes,
            progress=not args.json,
            producer_settings={"idempotent": args.mode == "idempotent"},
        )
        result["idempotent"] = args.mode == "idempotent"
    print(json.dumps(result))
    return 0


def _add_production_parser(bsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bp = bsub.add_parser(
        "production",
        help="delayed delivery lateness, idempotent or plain produce, transaction throughput",
    )
    bp.add_argument(
        "--mode",
        choices=PRODUCTION_MODES,
        default="timer",
        help="timer: schedule --messages delayed messages over --window-s, read them back, "
        "their lateness; plain / idempotent: produce with idempotence off / on; transactions: "
        "send + commit, --concurrency at once",
    )
    bp.add_argument("--topic", help="default Bench<Mode>")
    bp.add_argument("--messages", type=int, default=100_000, help="messages (or transactions)")
    bp.add_argument("--body-bytes", type=int, default=1024)
    bp.add_argument("--window-s", type=float, default=60.0, help="timer: delivery times span")
    bp.add_argument(
        "--lead-s",
        type=float,
        help="timer: from the start of scheduling to the first delivery time (default: "
        "estimated from a warm-up, so that all are pending before the first is due)",
    )
    bp.add_argument("--concurrency", type=int, default=16, help="transactions at once")
    bp.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    add_nameserver(bp)
    bp.set_defaults(func=cmd_bench_production)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    b = sub.add_parser("bench", help="measure produce, consume and receive rates (JSON)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    bp = bsub.add_parser("produce", help="one producer process, SDK batching")
    bp.add_argument("--topic", default="BenchTopic")
    bp.add_argument("--messages", type=int, default=200_000)
    bp.add_argument("--body-bytes", type=int, default=1024)
    bp.add_argument(
        "--unbatched",
        action="store_true",
        help="one message per request, one in flight: latency percentiles",
    )
    bp.add_argument(
        "--rate",
        type=float,
        metavar="MSGS_PER_S",
        help="send at this many messages per second, warm-up included (default: as fast as "
        "possible); msgs_per_s then reports the rate achieved",
    )
    bp.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    add_nameserver(bp)
    bp.set_defaults(func=cmd_bench_produce)
    bc = bsub.add_parser("consume", help="read what the topic holds with a new group")
    bc.add_argument("--topic", default="BenchTopic")
    bc.add_argument("--messages", type=int, default=200_000)
    bc.add_argument("--group")
    bc.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    add_nameserver(bc)
    bc.set_defaults(func=cmd_bench_consume)
    br = bsub.add_parser(
        "receive", help="receive and ack what the topic holds with a new receive group"
    )
    br.add_argument("--topic", default="BenchTopic")
    br.add_argument("--messages", type=int, default=200_000)
    br.add_argument("--group")
    br.add_argument(
        "--mode",
        choices=MODES,
        default="simple",
        help="simple: SimpleConsumer, receive then ack each batch; async: AsyncSimpleConsumer, "
        "acks overlapping the next receive; push: PushConsumer; hold: receive, never ack",
    )
    br.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help="max messages per receive call"
    )
    br.add_argument(
        "--invisible-s", type=float, default=60.0, help="invisible duration of each receive"
    )
    br.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    add_nameserver(br)
    br.set_defaults(func=cmd_bench_receive)
    _add_production_parser(bsub)
