"""The official Python client's SimpleConsumer, as an application uses it.

Plan: ``endpoints``, ``group``, ``topic``, ``tag`` (filter expression, default "*"),
``await_s`` (long poll), ``rounds``: each ``count`` (messages to collect; 0: whatever comes until
``timeout_s``), ``invisible_s``, ``timeout_s``, ``change_invisible_s`` (then change each
message's invisible duration), ``ack`` (then ack each). A message is handled (changed, acked) as
soon as it is received, as FIFO consumption needs.

Prints ``received`` (round and the message), ``changed``, ``acked`` or ``error`` per message,
``round_done`` per round, then ``done``."""

from __future__ import annotations

import time
from typing import Any

from rocketmq import FilterExpression, SimpleConsumer

from tests.interop.python.plan import (
    configuration,
    emit,
    error_json,
    message_json,
    read_plan,
    tls_enable,
)


def handle(consumer: Any, n: int, step: dict[str, Any], m: Any) -> None:
    emit("received", round=n, **message_json(m))
    try:
        if step.get("change_invisible_s"):
            consumer.change_invisible_duration(m, step["change_invisible_s"])
            emit(
                "changed", round=n, message_id=m.message_id, invisible_s=step["change_invisible_s"]
            )
        if step.get("ack"):
            consumer.ack(m)
            emit("acked", round=n, message_id=m.message_id)
    except Exception as e:  # noqa: BLE001 - reported as a line: what the client raised
        emit("error", round=n, message_id=m.message_id, **error_json(e))


def run_round(consumer: Any, n: int, step: dict[str, Any]) -> None:
    count = step.get("count", 0)
    got = 0
    deadline = time.monotonic() + step.get("timeout_s", 20)
    while (count == 0 or got < count) and time.monotonic() < deadline:
        batch = consumer.receive(max(count - got, 1) if count else 16, step["invisible_s"])
        for m in batch:
            handle(consumer, n, step, m)
        got += len(batch)
    emit("round_done", round=n, received=got)


def main() -> None:
    plan = read_plan()
    subscription = {plan["topic"]: FilterExpression(plan.get("tag", "*"))}
    consumer = SimpleConsumer(
        configuration(plan),
        plan["group"],
        subscription,
        await_duration=plan.get("await_s", 5),
        tls_enable=tls_enable(plan),
    )
    consumer.startup()
    try:
        for n, step in enumerate(plan["rounds"]):
            run_round(consumer, n, step)
    finally:
        consumer.shutdown()
    emit("done")


if __name__ == "__main__":
    main()
