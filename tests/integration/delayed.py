"""Helpers for delayed-delivery tests: a consumer that records when each message became
visible (its store time in its topic), and the broker's list of pending delayed messages."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import tidemq
from tests.integration.conftest import BrokerProcess
from tidemq.protos import broker_pb2
from tidemq.types import ReceivedMessage


@dataclass
class Arrivals:
    """Messages consumed from a topic, by body (a consumer thread fills it)."""

    nameserver: str
    topic: str
    group: str = "delayed-watch"
    got: dict[bytes, ReceivedMessage] = field(default_factory=dict)
    copies: dict[bytes, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Arrivals:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        with tidemq.Consumer(
            self.nameserver, group=self.group, topic=self.topic, start_from="first"
        ) as consumer:
            while not self._stop.is_set():
                for m in consumer.poll(max_messages=256, timeout_s=0.2):
                    with self._lock:
                        self.copies[m.body] = self.copies.get(m.body, 0) + 1
                        self.got.setdefault(m.body, m)

    def count(self) -> int:
        with self._lock:
            return len(self.got)

    def has(self, body: bytes) -> bool:
        with self._lock:
            return body in self.got


def list_delayed(
    broker: BrokerProcess, topic: str = "", limit: int = 100
) -> broker_pb2.ListDelayedMessagesResponse:
    return broker.stub().ListDelayedMessages(
        broker_pb2.ListDelayedMessagesRequest(topic=topic, limit=limit), timeout=10
    )
