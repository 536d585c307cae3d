"""Helpers of the failback tests: a thread that keeps asking every broker of a group for a
consumer group's committed offsets, so a test can hold each broker's view to "never backwards",
and consumers that read a topic until they have what they were asked for."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import grpc

import tidemq
from tidemq.protos import broker_pb2, broker_pb2_grpc

POLL_INTERVAL_S = 0.02


class OffsetWatch:
    """Polls ``QueryConsumerOffset`` of ``group``/``topic`` on every named broker; a broker
    that does not answer (dead, starting) is skipped. ``addresses`` names each broker's current
    address (a restarted broker may come back on another port)."""

    def __init__(self, group: str, topic: str, queues: int) -> None:
        self.group = group
        self.topic = topic
        self.queues = queues
        self.addresses: dict[str, str] = {}
        self.seen: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OffsetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the offset watch hung"

    def _run(self) -> None:
        channels: dict[str, grpc.Channel] = {}
        try:
            while not self._stop.is_set():
                for name, address in list(self.addresses.items()):
                    if address not in channels:
                        channels[address] = grpc.insecure_channel(address)
                    stub = broker_pb2_grpc.BrokerStub(channels[address])
                    for q in range(self.queues):
                        try:
                            r = stub.QueryConsumerOffset(
                                broker_pb2.QueryConsumerOffsetRequest(
                                    group=self.group, topic=self.topic, queue_id=q
                                ),
                                timeout=1,
                            )
                        except grpc.RpcError:
                            break
                        if r.found:
                            with self._lock:
                                self.seen.setdefault((name, q), []).append(int(r.offset))
                self._stop.wait(POLL_INTERVAL_S)  # a sampling period; stop ends it at once
        finally:
            for c in channels.values():
                c.close()

    def latest(self, name: str) -> list[int | None]:
        with self._lock:
            return [
                (self.seen.get((name, q)) or [None])[-1]  # type: ignore[list-item]
                for q in range(self.queues)
            ]

    def highest(self) -> list[int]:
        """Per queue, the highest offset any broker ever answered."""
        with self._lock:
            return [
                max((max(v) for (_, q), v in self.seen.items() if q == queue and v), default=-1)
                for queue in range(self.queues)
            ]

    def backwards(self) -> list[str]:
        """Every broker's view that moved back, as readable lines."""
        out = []
        with self._lock:
            for (name, q), views in sorted(self.seen.items()):
                for before, after in itertools.pairwise(views):
                    if after < before:
                        out.append(f"{name} queue {q}: {before} then {after}")
                        break
        return out


def consume(
    consumer: tidemq.Consumer,
    want: Callable[[list[tidemq.ReceivedMessage]], bool],
    timeout_s: float,
    got: list[tidemq.ReceivedMessage] | None = None,
    max_messages: int = 64,
) -> list[tidemq.ReceivedMessage]:
    """Poll ``max_messages`` at a time until ``want`` says the messages received so far (added
    to ``got``) are enough; fails at the deadline."""
    got = [] if got is None else got
    deadline = time.monotonic() + timeout_s
    while not want(got):
        if time.monotonic() > deadline:
            counts: dict[int, int] = {}
            for m in got:
                counts[m.queue_id] = counts.get(m.queue_id, 0) + 1
            raise AssertionError(
                f"timed out after {timeout_s}s consuming: per queue {counts}; "
                f"last error {consumer.last_error}"
            )
        got += consumer.poll(max_messages=max_messages, timeout_s=0.5)
    return got
