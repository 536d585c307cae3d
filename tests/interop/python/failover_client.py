"""The official Python client's Producer and SimpleConsumer in one process, as a service uses
them through a failover: the producer sends numbered messages one after another, the consumer
receives and acks what comes, and neither is restarted whatever the brokers do; a failure is
reported, then the application carries on.

Plan: ``endpoints``, ``topic``, ``group``, ``await_s`` (long poll), ``invisible_s``,
``send_interval_ms`` (between two sends), ``error_pause_ms`` (after a failed call).

Prints ``started`` once the consumer's first receive returned (its group exists, so every
message sent afterwards is for it), then ``sent`` (n, body, message_id, offset, endpoint: the
broker that answered) or ``send_error`` per send, ``received`` (body, message_id, attempt,
endpoint) and ``acked`` or ``ack_error`` per message, ``receive_error`` per failed receive. A
line ``stop_producing`` on stdin ends the sends (``producing_stopped``); the end of stdin ends
the consumer too, then ``done``."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from tests.interop.python.plan import configuration, emit, error_json, read_plan, wall_ms

_emitting = threading.Lock()


def say(event: str, **fields: Any) -> None:
    """``emit`` from either thread, one whole line at a time."""
    with _emitting:
        emit(event, at_ms=wall_ms(), **fields)


def produce(producer: Any, plan: dict[str, Any], stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        message = Message()
        message.topic = plan["topic"]
        message.body = f"m-{n}".encode()
        try:
            receipt = producer.send(message)
        except Exception as e:  # noqa: BLE001 - reported as a line: what the client raised
            say("send_error", n=n, body=f"m-{n}", **error_json(e))
            time.sleep(plan["error_pause_ms"] / 1000)
        else:
            say(
                "sent",
                n=n,
                body=f"m-{n}",
                message_id=receipt.message_id,
                offset=receipt.offset,
                endpoint=str(receipt.message_queue.endpoints),
            )
            time.sleep(plan["send_interval_ms"] / 1000)
        n += 1
    say("producing_stopped", sends=n)


def consume(consumer: Any, plan: dict[str, Any], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            batch = consumer.receive(16, plan["invisible_s"])
        except Exception as e:  # noqa: BLE001 - reported as a line: what the client raised
            say("receive_error", **error_json(e))
            time.sleep(plan["error_pause_ms"] / 1000)
            continue
        for m in batch:
            say(
                "received",
                body=m.body.decode(),
                message_id=m.message_id,
                delivery_attempt=m.delivery_attempt,
                endpoint=str(m.endpoints),
            )
            try:
                consumer.ack(m)
            except Exception as e:  # noqa: BLE001 - it comes back after its invisible time
                say("ack_error", message_id=m.message_id, **error_json(e))
            else:
                say("acked", message_id=m.message_id)


def main() -> None:
    plan = read_plan()
    config = configuration(plan)
    subscription = {plan["topic"]: FilterExpression("*")}
    consumer = SimpleConsumer(config, plan["group"], subscription, await_duration=plan["await_s"])
    producer = Producer(config, (plan["topic"],))
    consumer.startup()
    producer.startup()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    try:
        # A new group starts at the end of the topic: it exists once a receive has returned.
        consumer.receive(16, plan["invisible_s"])
        say("started")
        threads = [
            threading.Thread(target=consume, args=(consumer, plan, stop_consuming)),
            threading.Thread(target=produce, args=(producer, plan, stop_producing)),
        ]
        for t in threads:
            t.start()
        for line in sys.stdin:  # until the test closes our stdin
            if line.strip() == "stop_producing":
                stop_producing.set()
        stop_producing.set()
        stop_consuming.set()
        for t in threads:
            t.join()
    finally:
        producer.shutdown()
        consumer.shutdown()
    say("done")


if __name__ == "__main__":
    main()
