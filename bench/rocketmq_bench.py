"""RocketMQ 5 protocol benchmark: the official Python client producing through a broker's v2
listener (``--rocketmq-listen``) beside tidemq's own SDK, in the same run, with the broker's CPU
per message on each protocol, beside perfkit's gRPC ceilings measured in the same run.

usage: python bench/rocketmq_bench.py --perfkit ../shared/perfkit [--runs 3] [--messages 5000]
           [--warmup 500] [--concurrency 16] [--body-bytes 1024] [--batched-messages 50000]
           [--rocketmq-python .venv-rocketmq/bin/python] [--profile-to FILE]

One nameserver and one broker (ASYNC_MASTER, ASYNC flush, no slave) serving both protocols.
Per run, on 1 KiB messages (``own`` and ``v2`` alternate which goes first):
1. ``own``: tidemq's SDK ``Producer`` (in this process) on tidemq's protocol, one message per
   SendMessage call and ``--concurrency`` unanswered at a time (``send_window``), idempotence
   off: the same calls and the same stored work as the official client's;
2. ``v2``: the official Python client (PyPI ``rocketmq-python-client``, its own environment and
   process: ``rocketmq_official_producer.py``) through the v2 listener, ``send_async`` with the
   same window; it sends one message per call (it has no batching);
3. ``own_batched`` (reference, not a goal: the official client cannot batch): the SDK's own
   batching (``tidemq bench produce``'s loop, idempotence off), ``--batched-messages``;
4. perfkit's ``grpc_bench.py`` cases unary_c64 (the ceiling of one message per call: calls/s and
   the server's CPU per call) and batch256_c8 (the batch ceiling), on an aio server (skipped
   with ``--perfkit ''``).
Each case: msgs/s, the client-observed latency (send to answer, p50/p99), the client's CPU per
message, the broker process's CPU per message (user + system over the measured sends, from
/proc), and whether the topic holds exactly what was sent (``stored_as_sent``).

Prints one JSON object per line, and last a ``summary``: medians, the median of each run's
ratios (``v2_vs_own_broker_cpu_per_msg``: goal <= 1.5) and one boolean per goal.
With ``--profile-to FILE`` the broker runs under cProfile (its CPU figures include the
profiler's cost) and writes FILE when it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from common import REPO, emit, emit_summary, failure, free_port, perfkit_grpc, wait_until
from receive_broker import BenchBroker
from send_window import SEND_OK, Window, measured

import tidemq
from tidemq.cli.bench import WARMUP_MESSAGES, run_produce_bench

BROKER_NAME = "bench-rocketmq"
OWN_TOPIC = "BenchOwnProtocol"
V2_TOPIC = "BenchRocketMQ5"
BATCHED_TOPIC = "BenchOwnBatched"
QUEUES = 4
V2_CPU_GOAL = 1.5  # the v2 path's broker CPU per message, at most this times our protocol's
CEILINGS = ("unary_c64", "batch256_c8")
ROCKETMQ_PYTHON = os.path.join(REPO, ".venv-rocketmq", "bin", "python")
PROGRAM = os.path.join(REPO, "bench", "rocketmq_official_producer.py")
PROGRAM_TIMEOUT_S = 120.0


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


class V2Broker(BenchBroker):
    """A bench broker that also serves ``apache.rocketmq.v2`` on ``rocketmq_address``."""

    def __init__(self, directory: str, store: str, profile_to: str | None) -> None:
        self.rocketmq_address = f"127.0.0.1:{free_port()}"
        super().__init__(
            directory,
            store,
            profile_to=profile_to,
            broker_name=BROKER_NAME,
            extra_args=("--rocketmq-listen", self.rocketmq_address),
        )
        try:
            wait_until(lambda: _listening(self.rocketmq_address), "v2 listener", self.procs)
            with tidemq.Admin(self.nameserver) as admin:
                wait_until(lambda: bool(admin.masters()), "broker routed", self.procs)
                for topic in (OWN_TOPIC, V2_TOPIC, BATCHED_TOPIC):
                    admin.create_topic(topic, queues=QUEUES)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> V2Broker:
        return self


def case_figures(
    name: str, run: int, r: dict[str, Any], cpu_s: float, stored: int
) -> dict[str, Any]:
    """A case's line: the client's figures and the broker's CPU per measured message."""
    return {
        **r,
        "bench": name,
        "run": run,
        "broker_cpu_us_per_msg": round(cpu_s / r["messages"] * 1e6, 2),
        "stored": stored,
    }


def own(broker: BenchBroker, run: int, args: argparse.Namespace) -> dict[str, Any]:
    """tidemq's SDK on tidemq's protocol: one message per call, ``--concurrency`` in flight."""
    body = b"x" * args.body_bytes
    before = broker.topic_messages(OWN_TOPIC)
    settings = {
        "batch_max_messages": 1,
        "max_in_flight_per_broker": args.concurrency,
        "idempotent": False,
    }
    with tidemq.Producer(broker.nameserver, **settings) as producer:

        def send(b: bytes) -> Any:
            return producer.send_async(OWN_TOPIC, b)

        window = Window(args.concurrency)
        window.run(send, [body] * args.warmup)
        requests0, cpu0 = producer.stats.requests, broker.cpu_s()
        r = measured(window, send, [body] * args.messages)
        cpu = broker.cpu_s() - cpu0
        r.update(
            body_bytes=args.body_bytes,
            messages_per_request=round(args.messages / (producer.stats.requests - requests0), 2),
        )
    stored = broker.topic_messages(OWN_TOPIC) - before
    out = case_figures("own", run, r, cpu, stored)
    out["stored_as_sent"] = stored == args.warmup + args.messages
    return out


class OfficialProducer:
    """``rocketmq_official_producer.py`` in the client's own environment: its JSON lines read
    by a thread, each awaited with a deadline."""

    def __init__(self, python: str, plan: dict[str, Any], home: str) -> None:
        os.makedirs(home, exist_ok=True)
        env = {**os.environ, "HOME": home}  # the client logs under ~/logs
        env.pop("PYTHONPATH", None)  # tidemq's modules stay out of the client's process
        self.stderr_path = os.path.join(home, "producer.stderr")
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [python, PROGRAM, json.dumps(plan)],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def event(self, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + PROGRAM_TIMEOUT_S
        while True:
            try:
                e = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self.failed(f"no {kind!r} within {PROGRAM_TIMEOUT_S:.0f} s") from None
            if e is None:
                raise self.failed(f"it exited before {kind!r}")
            if e.get("event") == kind:
                return e

    def tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(PROGRAM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise self.failed("it did not exit once told to") from None
        if self.proc.returncode != 0:
            raise self.failed(f"it exited with {self.proc.returncode}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def failed(self, what: str) -> RuntimeError:
        self.kill()
        with open(self.stderr_path, errors="replace") as f:
            stderr = f.read()[-4000:]
        return RuntimeError(f"the official client's producer: {what}\n{stderr}")


def v2(broker: V2Broker, run: int, args: argparse.Namespace, scratch: str) -> dict[str, Any]:
    """The official Python client through the v2 listener, the same window as ``own``."""
    before = broker.topic_messages(V2_TOPIC)
    plan = {
        "endpoints": broker.rocketmq_address,
        "topic": V2_TOPIC,
        "messages": args.messages,
        "warmup": args.warmup,
        "concurrency": args.concurrency,
        "body_bytes": args.body_bytes,
    }
    program = OfficialProducer(args.rocketmq_python, plan, os.path.join(scratch, "home"))
    try:
        warm = program.event("warm")
        if set(warm["statuses"]) - {SEND_OK}:
            raise program.failed(f"warm-up sends failed: {warm['statuses']}")
        cpu0 = broker.cpu_s()
        program.tell("go\n")
        done = program.event("done")
        cpu = broker.cpu_s() - cpu0
        program.finish()
    except BaseException:
        program.kill()
        if not all(p.alive() for p in broker.procs):
            raise failure("the broker died", broker.procs) from None
        raise
    done.pop("event")
    stored = broker.topic_messages(V2_TOPIC) - before
    out = case_figures("v2", run, done, cpu, stored)
    out["stored_as_sent"] = stored == args.warmup + args.messages
    return out


def own_batched(broker: BenchBroker, run: int, args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's batching (what it does by default), idempotence off: a reference."""
    before = broker.topic_messages(BATCHED_TOPIC)
    cpu: dict[str, float] = {}
    p = run_produce_bench(
        broker.nameserver,
        topic=BATCHED_TOPIC,
        messages=args.batched_messages,
        body_bytes=args.body_bytes,
        progress=False,
        producer_settings={"idempotent": False},
        on_window=lambda edge: cpu.__setitem__(edge, broker.cpu_s()),
    )
    stored = broker.topic_messages(BATCHED_TOPIC) - before
    out = case_figures("own_batched", run, p, cpu["end"] - cpu["start"], stored)
    out["stored_as_sent"] = stored == args.batched_messages + min(
        WARMUP_MESSAGES, args.batched_messages
    )
    return out


def one_run(run: int, broker: V2Broker, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    cases = ["own", "v2"] if run % 2 == 0 else ["v2", "own"]  # neither always goes first
    for case in cases:
        r = own(broker, run, args) if case == "own" else v2(broker, run, args, scratch)
        emit(r)
        figures.update(
            {
                f"{case}_msgs_per_s": r["msgs_per_s"],
                f"{case}_broker_cpu_us": r["broker_cpu_us_per_msg"],
                f"{case}_client_cpu_us": r["client_cpu_us_per_msg"],
                f"{case}_p50_us": r["p50_us"],
                f"{case}_p99_us": r["p99_us"],
            }
        )
    if args.batched_messages:
        b = own_batched(broker, run, args)
        emit(b)
        figures.update(
            batched_msgs_per_s=b["msgs_per_s"], batched_broker_cpu_us=b["broker_cpu_us_per_msg"]
        )
    if args.perfkit:
        ceilings = perfkit_grpc(args.perfkit, CEILINGS)
        for case, c in ceilings.items():
            emit({**c, "bench": f"ceiling_{case}", "run": run})
        unary, batch = ceilings["unary_c64"], ceilings["batch256_c8"]
        figures.update(
            ceiling_unary_calls_per_s=unary["calls_per_s"],
            ceiling_unary_server_cpu_us_per_call=unary["cpu_us_per_call_server"],
            ceiling_batch_msgs_per_s=batch["msgs_per_s"],
            ceiling_batch_server_cpu_us_per_msg=batch["cpu_us_per_call_server"] / 256,
        )
    return figures


def ratios(r: dict[str, float]) -> dict[str, float]:
    out = {
        "v2_vs_own_broker_cpu_per_msg": r["v2_broker_cpu_us"] / r["own_broker_cpu_us"],
        "v2_vs_own_msgs_per_s": r["v2_msgs_per_s"] / r["own_msgs_per_s"],
    }
    if "batched_broker_cpu_us" in r:
        out["v2_vs_own_batched_broker_cpu_per_msg"] = (
            r["v2_broker_cpu_us"] / r["batched_broker_cpu_us"]
        )
    if "ceiling_unary_calls_per_s" in r:
        unary_cpu = r["ceiling_unary_server_cpu_us_per_call"]
        out.update(
            own_vs_unary_ceiling_calls_per_s=r["own_msgs_per_s"] / r["ceiling_unary_calls_per_s"],
            v2_vs_unary_ceiling_calls_per_s=r["v2_msgs_per_s"] / r["ceiling_unary_calls_per_s"],
            own_broker_cpu_vs_unary_ceiling_server_cpu=r["own_broker_cpu_us"] / unary_cpu,
            v2_broker_cpu_vs_unary_ceiling_server_cpu=r["v2_broker_cpu_us"] / unary_cpu,
        )
        if "batched_msgs_per_s" in r:
            out["batched_vs_batch_ceiling"] = (
                r["batched_msgs_per_s"] / r["ceiling_batch_msgs_per_s"]
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--batched-messages", type=int, default=50_000, help="0: not measured")
    parser.add_argument("--rocketmq-python", default=ROCKETMQ_PYTHON)
    parser.add_argument("--profile-to", help="run the broker under cProfile, its profile here")
    args = parser.parse_args()
    if min(args.runs, args.messages, args.warmup, args.concurrency, args.body_bytes) < 1:
        parser.error("--runs, --messages, --warmup, --concurrency and --body-bytes must be >= 1")
    if args.batched_messages < 0:
        parser.error("--batched-messages must be >= 0")
    if not os.path.exists(args.rocketmq_python):
        parser.error(
            f"{args.rocketmq_python} is missing: `make interop-deps` builds the official "
            f"client's environment"
        )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = tempfile.mkdtemp(prefix="tidemq-rocketmq-bench-")
    try:
        with V2Broker(
            os.path.join(scratch, "broker"), os.path.join(scratch, "store"), args.profile_to
        ) as broker:
            runs = [one_run(i, broker, args, scratch) for i in range(args.runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(
        runs,
        ratios,
        lambda med, r: {
            "v2_broker_cpu_per_msg_le_1_5x_own": r["v2_vs_own_broker_cpu_per_msg"] <= V2_CPU_GOAL
        },
        reported={
            "messages": args.messages,
            "concurrency": args.concurrency,
            "body_bytes": args.body_bytes,
            "profiled": bool(args.profile_to),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
