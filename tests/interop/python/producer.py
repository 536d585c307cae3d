"""The official Python client's Producer, as an application uses it.

Plan: ``endpoints``, ``topic``, ``messages`` (each: ``body``; optional ``tag``, ``keys``,
``properties``, ``message_group`` (FIFO), ``deliver_at_ms`` (delayed; the client sends whole
seconds, rounded up here so it is never earlier), ``transaction``: "commit" | "rollback" |
"open" (sent in a transaction that is then committed, rolled back or left to the broker's
check)), ``checker``: the resolution its TransactionChecker answers ("commit" or "rollback"),
``stay``: keep running (answering checks) until stdin closes.

Prints ``sent`` (body, message_id, offset, transaction_id, recall_handle) or ``send_error`` per
message, ``ended`` per commit/rollback, ``checked`` per check the broker asked, then ``done``."""

from __future__ import annotations

import math
import sys
from typing import Any

from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

from tests.interop.python.plan import (
    configuration,
    emit,
    error_json,
    message_json,
    read_plan,
    tls_enable,
)

RESOLUTIONS = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK}


class Checker(TransactionChecker):  # type: ignore[misc]
    """Answers every check with the plan's resolution, and says so."""

    def __init__(self, resolution: str) -> None:
        self.resolution = resolution

    def check(self, message: Any) -> Any:
        emit("checked", resolution=self.resolution, **message_json(message))
        return RESOLUTIONS[self.resolution]


def build(topic: str, spec: dict[str, Any]) -> Any:
    m = Message()
    m.topic = topic
    m.body = spec["body"].encode()
    if spec.get("tag"):
        m.tag = spec["tag"]
    for key in spec.get("keys", []):
        m.keys = key  # each assignment adds one key
    for name, value in spec.get("properties", {}).items():
        m.add_property(name, value)
    if spec.get("message_group"):
        m.message_group = spec["message_group"]
    if spec.get("deliver_at_ms"):
        m.delivery_timestamp = math.ceil(spec["deliver_at_ms"] / 1000)
    return m


def send(producer: Any, topic: str, spec: dict[str, Any]) -> None:
    message = build(topic, spec)
    transaction = producer.begin_transaction() if spec.get("transaction") else None
    receipt = producer.send(message, transaction)
    emit(
        "sent",
        body=spec["body"],
        message_id=receipt.message_id,
        offset=receipt.offset,
        transaction_id=receipt.transaction_id,
        recall_handle=receipt.recall_handle,
        deliver_at_ms=message.delivery_timestamp * 1000 if spec.get("deliver_at_ms") else None,
    )
    resolution = spec.get("transaction")
    if transaction is not None and resolution in ("commit", "rollback"):
        getattr(transaction, resolution)()
        emit("ended", body=spec["body"], resolution=resolution)


def main() -> None:
    plan = read_plan()
    topic = plan["topic"]
    checker = Checker(plan.get("checker", "commit"))
    producer = Producer(configuration(plan), (topic,), checker=checker, tls_enable=tls_enable(plan))
    producer.startup()
    try:
        for spec in plan["messages"]:
            try:
                send(producer, topic, spec)
            except Exception as e:  # noqa: BLE001 - reported as a line: what the client raised
                emit("send_error", body=spec["body"], **error_json(e))
        if plan.get("stay"):
            emit("staying")
            sys.stdin.read()  # until the test closes our stdin
    finally:
        producer.shutdown()
    emit("done")


if __name__ == "__main__":
    main()
