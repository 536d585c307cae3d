"""What in-flight receive state costs in memory, measured two ways.

1. ``broker_inflight_memory``: a real broker holds ``count`` messages invisible (received with
   a long invisible time, never acked); its RssAnon growth (the heap; the store's mapped files
   are RssFile) per message held, extrapolated to a million. A control before it receives and
   acks messages of another group on the same topic, so the allocator's arenas are warm and
   transient buffers of the receive path are not counted as state; its own growth is reported.
2. ``state_object_memory``: the broker's state object itself (``ReceiveStates``) in this
   process, fed the events a receive of 32 messages writes, ``count`` messages over 8 queues,
   measured with tracemalloc (exact Python allocations, no allocator slack).
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

from common import tidemq_bench
from receive_broker import BenchBroker

from tidemq.cli.bench_receive import run_receive_bench
from tidemq.services.broker.receive.events import Init, QueueKey, Received
from tidemq.services.broker.receive.states import ReceiveStates

TOPIC = "BenchInflight"
# The state does not depend on the body; small bodies keep the preload and the receives short.
BODY_BYTES = "128"
HOLD_INVISIBLE_S = 3_600.0
WARM_MESSAGES = 2_048
CONTROL_MESSAGES = 50_000
RECEIVE_BATCH = 1_024
STATE_QUEUES = 8
STATE_BATCH = 32
MILLION = 1_000_000


def broker_inflight_memory(broker: BenchBroker, count: int) -> dict[str, Any]:
    """``count`` messages held in flight by one receive group: the broker's RssAnon growth."""
    control = min(CONTROL_MESSAGES, count)
    tidemq_bench(
        broker.nameserver,
        "produce",
        "--topic",
        TOPIC,
        "--messages",
        str(count + control),
        "--body-bytes",
        BODY_BYTES,
    )
    ns = broker.nameserver

    def receive(group: str, n: int, mode: str) -> dict[str, Any]:
        return run_receive_bench(
            ns,
            topic=TOPIC,
            group=group,
            messages=n,
            mode=mode,
            batch=RECEIVE_BATCH,
            invisible_s=HOLD_INVISIBLE_S,
        )

    rss0 = broker.rss()
    receive("bench-memory-control", control, "simple")
    rss1 = broker.rss()
    receive("bench-memory-hold", WARM_MESSAGES, "hold")  # Init events, first-use code paths
    rss2 = broker.rss()
    held = receive("bench-memory-hold", count - WARM_MESSAGES, "hold")
    rss3 = broker.rss()
    state = broker.receive_state("bench-memory-hold", TOPIC)
    n = held["messages"]
    growth = rss3["RssAnon"] - rss2["RssAnon"]
    return {
        "bench": "inflight_memory_broker",
        "messages_in_flight": state["inflight"],
        "measured_over": n,
        "extrapolated_to_million": n != MILLION,
        "rss_anon_before_bytes": rss2["RssAnon"],
        "rss_anon_growth_bytes": growth,
        "rss_anon_bytes_per_message": round(growth / n, 1) if n else 0.0,
        "rss_anon_bytes_per_million": round(growth / n * MILLION) if n else 0,
        "hold_receive_msgs_per_s": held["msgs_per_s"],
        "control_acked_messages": control,
        "control_rss_anon_growth_bytes": rss1["RssAnon"] - rss0["RssAnon"],
        "vm_rss_growth_bytes": rss3["VmRSS"] - rss2["VmRSS"],
    }


def state_object_memory(count: int) -> dict[str, Any]:
    """tracemalloc of ``ReceiveStates`` holding ``count`` in-flight messages."""
    states = ReceiveStates()
    keys = [QueueKey("bench-state", "BenchTopic", q) for q in range(STATE_QUEUES)]
    for key in keys:
        states.apply(Init(key, 0), 0)
    now_ms = int(time.time() * 1000)
    until_ms = now_ms + int(HOLD_INVISIBLE_S * 1000)
    lease = 1
    cursors = dict.fromkeys(keys, 0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        for i in range(count // STATE_BATCH):
            key = keys[i % STATE_QUEUES]
            start = cursors[key]
            cursors[key] = start + STATE_BATCH
            event = Received(
                key,
                now_ms,
                until_ms,
                tuple((o, 1, 0) for o in range(start, start + STATE_BATCH)),
                (),
                (),
                start + STATE_BATCH,
            )
            states.apply(event, lease)
            lease += 300  # record positions in the log grow with each event
        apply_s = time.perf_counter() - t0
        del event
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    held = sum(cursors.values())
    out: dict[str, Any] = {
        "bench": "inflight_memory_state_object",
        "messages_in_flight": held,
        "queues": STATE_QUEUES,
        "messages_per_event": STATE_BATCH,
        "traced_bytes": after - before,
        "bytes_per_message": round((after - before) / held, 1),
        "bytes_per_million": round((after - before) / held * MILLION),
        "apply_us_per_event_traced": round(apply_s / (held / STATE_BATCH) * 1e6, 1),
    }
    estimate = getattr(states, "memory_bytes_estimate", None)
    if callable(estimate):
        out["memory_bytes_estimate"] = estimate()
    return out
