"""Helpers for delayed-delivery tests: a consumer that records when each message became
visible (its store time in its topic), and the broker's list of pending delayed messages."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import tidemq
from tests.integration.conftest import BrokerProcess
from tests.integration.replicas import pull_messages
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


def stored(broker: BrokerProcess, topic: str, queues: int) -> dict[bytes, list[int]]:
    """Every message of ``topic`` on ``broker``: body -> the store times of its copies (when
    each became visible in its topic)."""
    out: dict[bytes, list[int]] = {}
    for q in range(queues):
        for m in pull_messages(broker, q, topic, group="delayed-scan"):
            out.setdefault(m.body, []).append(m.store_timestamp_ms)
    return out


def stored_count(broker: BrokerProcess, topic: str) -> int:
    """Messages in ``topic`` on ``broker`` (its queues' max offsets: cheap to poll)."""
    r = broker.stub().GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=10)
    return sum(q.max_offset for q in r.queues)


@dataclass
class Schedule:
    """What a run of delayed sends was told: body -> the delivery time its result named (0:
    due at once, stored directly)."""

    due: dict[bytes, int] = field(default_factory=dict)

    def send(self, producer: tidemq.Producer, topic: str, delays_s: list[float]) -> None:
        futures = [
            (f"m{i}".encode(), producer.send_async(topic, f"m{i}".encode(), delay=d))
            for i, d in enumerate(delays_s)
        ]
        for body, f in futures:
            r = f.result()
            assert r.ok, r
            self.due[body] = r.deliver_at_ms


def lateness_report(
    due: dict[bytes, int], seen: dict[bytes, list[int]], outage: tuple[float, float]
) -> tuple[list[str], list[int], list[str]]:
    """(problems, lateness in ms of messages due while a master served, messages due during
    the outage delivered later than a second after it). ``outage``: (from, to) in ms."""
    problems: list[str] = []
    late: list[int] = []
    after_outage: list[str] = []
    for body, at in due.items():
        copies = seen.get(body)
        if not copies:
            problems.append(f"{body!r} lost")
            continue
        first = min(copies)
        if at and first < at:
            problems.append(f"{body!r} visible at {first}, before its time {at}")
        if not at:
            continue
        if outage[0] <= at <= outage[1]:
            if first > outage[1] + 1_000:
                after_outage.append(f"{body!r} due {at} in the outage, visible at {first}")
        else:
            late.append(first - at)
    return problems, late, after_outage


def p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0
