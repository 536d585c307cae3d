"""The official RocketMQ Python client's producer under load, for ``bench/rocketmq_bench.py``:
messages sent with ``Producer.send_async`` (one message per SendMessage call: the client never
batches), ``concurrency`` unanswered at a time (``send_window``).

usage: .venv-rocketmq/bin/python bench/rocketmq_official_producer.py PLAN_JSON

Plan: ``endpoints`` (the broker's v2 address), ``topic``, ``messages``, ``warmup``,
``concurrency``, ``body_bytes``. Runs in the client's own environment (``make interop-deps``),
never beside tidemq's modules: the client's ``apache.rocketmq.v2`` stubs clash with ours.

Prints JSON lines: ``warm`` once the warm-up sends are answered; then waits for a line on stdin
(the caller reads the broker's CPU first), sends the measured messages and prints ``done`` with
the figures; then waits for stdin to close (the caller reads the broker's CPU again) and shuts
the producer down.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rocketmq import ClientConfiguration, Credentials, Message, Producer
from send_window import Window, measured


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def message(topic: str, body: bytes) -> Any:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def main() -> None:
    plan = json.loads(sys.argv[1])
    topic, body = plan["topic"], b"x" * plan["body_bytes"]
    config = ClientConfiguration(plan["endpoints"], Credentials(), namespace="")
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        window = Window(plan["concurrency"])
        # Messages are built before the clock starts: the run measures sending.
        window.run(producer.send_async, [message(topic, body) for _ in range(plan["warmup"])])
        emit("warm", statuses=dict(window.outcomes))
        sys.stdin.readline()
        batch = [message(topic, body) for _ in range(plan["messages"])]
        emit("done", body_bytes=plan["body_bytes"], **measured(window, producer.send_async, batch))
        sys.stdin.read()
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
