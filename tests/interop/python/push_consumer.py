"""The official Python client's PushConsumer with a listener that fails the first
``fail_times`` deliveries of each message, then succeeds.

Plan: ``endpoints``, ``group``, ``topic``, ``tag`` (default "*"), ``fail_times``. Runs until
stdin closes. Prints ``started``, then ``delivery`` per call of the listener (the message, the
listener's own count for it as ``local_attempt``, and ``ok``: what it answered), then ``done``."""

from __future__ import annotations

import collections
import sys
import threading
from typing import Any

from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

from tests.interop.python.plan import configuration, emit, message_json, read_plan


class FailingFirst(MessageListener):  # type: ignore[misc]
    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.calls: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def consume(self, message: Any) -> Any:
        with self.lock:
            self.calls[message.message_id] += 1
            n = self.calls[message.message_id]
        ok = n > self.fail_times
        emit("delivery", ok=ok, local_attempt=n, **message_json(message))
        return ConsumeResult.SUCCESS if ok else ConsumeResult.FAILURE


def main() -> None:
    plan = read_plan()
    listener = FailingFirst(plan.get("fail_times", 0))
    subscription = {plan["topic"]: FilterExpression(plan.get("tag", "*"))}
    consumer = PushConsumer(configuration(plan), plan["group"], listener, subscription)
    consumer.startup()
    emit("started")
    try:
        sys.stdin.read()  # until the test closes our stdin
    finally:
        consumer.shutdown()
    emit("done")


if __name__ == "__main__":
    main()
