"""Receive/ack benchmark: receive + ack consumption beside offset-based consumption of the same
messages in the same run, the broker's CPU per message for each, and the memory of in-flight
state.

usage: python bench/receive_bench.py --perfkit ../shared/perfkit [--runs 3] [--messages 50000]
           [--modes simple,async,push] [--inflight-messages 200000] [--profile FILE]

One broker (ASYNC flush, no slave: the goal is about one broker and one consumer process) holds
``--messages`` 1 KiB messages of ``BenchTopic`` (``tidemq bench produce``, plus its warm-up
messages). Per run, in this process (one consumer process), each on a new group reading every
message of the topic from the first:
1. ``consume``: the offset-based ``Consumer`` (``tidemq bench consume``'s loop);
2. per mode of ``--modes``, ``tidemq bench receive``'s loop: ``simple`` (SimpleConsumer: receive
   256, ack_many, repeat), ``async`` (AsyncSimpleConsumer, two receives in flight, acks
   overlapping the next receive), ``push`` (PushConsumer, 64 listeners returning SUCCESS, 256
   messages buffered ahead of them);
   the runs alternate which of 1 and 2 goes first; for each: msgs/s, the broker's CPU and this
   process's CPU per message over the measured part, and the group's receive state afterwards
   (``all_acked``: nothing in flight, every queue done);
3. perfkit's ``grpc_bench.py`` case batch256_c1 (256 x 1 KiB per call, one call in flight: the
   shape of a receive loop) on an aio server (skipped with ``--perfkit ''``).
Then once: in-flight memory (``receive_memory.py``): a broker holding ``--inflight-messages``
messages invisible, its heap growth per million (extrapolated when fewer are held; the line says
``extrapolated_to_million``), and the state object's own size under tracemalloc for a million.
With ``--profile FILE``: the broker restarted on the same store under cProfile, one ``simple``
receive + ack of the topic, the profile written to FILE and its top functions printed.

Prints one JSON object per line, and last a ``summary``: medians, each mode's ratio to
``consume`` (goal >= 0.5), and the memory figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import pstats
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from common import REPO, emit, emit_summary, perfkit_grpc, tidemq_bench
from receive_broker import BenchBroker
from receive_memory import broker_inflight_memory, state_object_memory

from tidemq.cli.bench import run_consume_bench
from tidemq.cli.bench_receive import run_receive_bench

TOPIC = "BenchTopic"
RECEIVE_VS_CONSUME_GOAL = 0.5
PROFILE_TOP = 25
HANDLERS = os.path.join("handlers", "receive.py")
# The event loop's idle wait and the broker's start (imports): not receive + ack's work.
NOT_THE_WORK = ("select.epoll", "builtins.compile", "builtins.exec", "marshal.loads", "<module>")


class BrokerCpu:
    """``on_window`` for the bench loops: the broker's CPU seconds at the window's edges."""

    def __init__(self, broker: BenchBroker) -> None:
        self.broker = broker
        self.at: dict[str, float] = {}

    def __call__(self, edge: str) -> None:
        self.at[edge] = self.broker.cpu_s()

    def us_per(self, messages: int) -> float:
        return round((self.at["end"] - self.at["start"]) / messages * 1e6, 2) if messages else 0.0


def _group(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"


def consume(broker: BenchBroker, run: int, messages: int) -> dict[str, Any]:
    cpu = BrokerCpu(broker)
    c = run_consume_bench(
        broker.nameserver,
        topic=TOPIC,
        group=_group("consume"),
        messages=messages,
        progress=False,
        on_window=cpu,
    )
    return {**c, "bench": "consume", "run": run, "broker_cpu_us_per_msg": cpu.us_per(c["messages"])}


def receive(broker: BenchBroker, run: int, messages: int, mode: str) -> dict[str, Any]:
    cpu = BrokerCpu(broker)
    group = _group(mode)
    r = run_receive_bench(
        broker.nameserver, topic=TOPIC, group=group, messages=messages, mode=mode, on_window=cpu
    )
    state = broker.receive_state(group, TOPIC)
    return {
        **r,
        "bench": f"receive_{mode}",
        "run": run,
        "broker_cpu_us_per_msg": cpu.us_per(r["messages"]),
        "all_acked": state["all_done"] and state["inflight"] == 0,
    }


def one_run(
    run: int, broker: BenchBroker, messages: int, modes: list[str], perfkit: str
) -> dict[str, float]:
    figures: dict[str, float] = {}

    def keep(name: str, r: dict[str, Any]) -> None:
        emit(r)
        figures[f"{name}_msgs_per_s"] = r["msgs_per_s"]
        figures[f"{name}_broker_cpu_us"] = r["broker_cpu_us_per_msg"]
        figures[f"{name}_client_cpu_us"] = r["client_cpu_us_per_msg"]

    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        (m, functools.partial(receive, broker, run, messages, m)) for m in modes
    ]
    first = run % 2 == 0  # alternate: neither side always reads the topic first
    steps.insert(0 if first else len(steps), ("consume", lambda: consume(broker, run, messages)))
    for name, step in steps:
        keep(name, step())
    if perfkit:
        ceiling = perfkit_grpc(perfkit, ["batch256_c1"])["batch256_c1"]
        emit({**ceiling, "bench": "ceiling_batch256_c1", "run": run})
        figures["ceiling_batch256_c1_msgs_per_s"] = ceiling["msgs_per_s"]
    return figures


def preload(broker: BenchBroker, messages: int) -> int:
    """``messages`` 1 KiB messages into the topic: how many it holds (with the warm-up's)."""
    p = tidemq_bench(broker.nameserver, "produce", "--topic", TOPIC, "--messages", str(messages))
    emit({**p, "bench": "preload"})
    return broker.topic_messages(TOPIC)


def profile_receive(scratch: str, messages: int, out: str) -> None:
    """A new store preloaded, then its broker restarted under cProfile (the profile shows no
    sends) for one ``simple`` receive + ack of the topic."""
    store = os.path.join(scratch, "profiled-store")
    with BenchBroker(os.path.join(scratch, "profiled-preload"), store) as broker:
        total = preload(broker, messages)
    with BenchBroker(os.path.join(scratch, "profiled"), store, profile_to=out) as broker:
        r = receive(broker, -1, total, "simple")
    emit({**r, "bench": "receive_simple_profiled"})
    emit_profile(out, r["messages"])


def emit_profile(path: str, messages: int) -> None:
    """The RPC handlers' cumulative time, then the functions of most own time (the idle wait
    and the start-up's imports left out), per message received and acked."""
    stats: Any = pstats.Stats(path)
    per_msg = 1e6 / messages if messages else 0.0
    rows = []
    for (file, line, func), (_, calls, tt, ct, _) in stats.stats.items():
        where = f"{file if file == '~' else os.path.relpath(file, REPO)}:{line}({func})"
        if file.endswith(HANDLERS) and func in ("ReceiveMessage", "AckMessage"):
            emit(
                {
                    "bench": "profile_rpc",
                    "rpc": func,
                    "calls": calls,
                    "cumtime_s": round(ct, 3),
                    "us_per_msg": round(ct * per_msg, 2),
                }
            )
        if not any(s in where for s in NOT_THE_WORK):
            rows.append((tt, ct, calls, where))
    rows.sort(reverse=True)
    for tt, ct, calls, where in rows[:PROFILE_TOP]:
        emit(
            {
                "bench": "profile",
                "function": where,
                "calls": calls,
                "tottime_s": round(tt, 3),
                "cumtime_s": round(ct, 3),
                "us_per_msg": round(tt * per_msg, 2),
            }
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--modes", default="simple,async,push")
    parser.add_argument("--inflight-messages", type=int, default=200_000)
    parser.add_argument("--state-messages", type=int, default=1_000_000)
    parser.add_argument("--profile", metavar="FILE", help="profile the broker's receive + ack")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if args.runs < 1 or args.messages < 1 or args.inflight_messages < 4096 or not modes:
        parser.error("--runs and --messages >= 1, --inflight-messages >= 4096, a mode at least")
    if any(m not in ("simple", "async", "push") for m in modes):
        parser.error("--modes: simple, async, push")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = tempfile.mkdtemp(prefix="tidemq-receive-bench-")
    try:
        with BenchBroker(os.path.join(scratch, "runs"), os.path.join(scratch, "store")) as broker:
            total = preload(broker, args.messages)
            runs = [one_run(i, broker, total, modes, args.perfkit) for i in range(args.runs)]
        # A broker of its own: its heap holds nothing of the runs.
        with BenchBroker(os.path.join(scratch, "memory"), os.path.join(scratch, "mstore")) as b:
            memory = broker_inflight_memory(b, args.inflight_messages)
        emit(memory)
        state = state_object_memory(args.state_messages)
        emit(state)
        if args.profile:
            profile_receive(scratch, args.messages, args.profile)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(
        runs,
        lambda r: {
            f"{m}_vs_consume": r[f"{m}_msgs_per_s"] / r["consume_msgs_per_s"] for m in modes
        },
        lambda med, ratios: {
            f"{m}_ge_50pct_consume": ratios[f"{m}_vs_consume"] >= RECEIVE_VS_CONSUME_GOAL
            for m in modes
        },
        reported={
            "inflight_rss_anon_bytes_per_million": memory["rss_anon_bytes_per_million"],
            "inflight_measured_over": memory["measured_over"],
            "state_object_bytes_per_million": state["bytes_per_million"],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
