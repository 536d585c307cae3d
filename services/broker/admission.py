"""Admission: how much work each client connection may have running in the broker at once.

A connection runs at most ``max_inflight_requests_per_connection`` requests and
``max_inflight_bytes_per_connection`` bytes of them (a request alone always runs, whatever its
size); the rest wait their turn in arrival order, so a client that floods the broker is slowed
to the pace its share allows while every other connection's requests keep running. Only past
the waiting bounds (per connection, and ``max_concurrent_rpcs`` over the whole broker) is a
request refused, and the refusal is retriable (``BROKER_BUSY``).

This module decides and keeps count; it knows nothing of gRPC, tasks or clocks. A ticket is
whatever the caller uses to resume a waiting request (``admission_grpc`` uses a future).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class AdmissionLimits:
    max_concurrent_rpcs: int
    max_inflight_requests_per_connection: int
    max_inflight_bytes_per_connection: int
    max_waiting_requests_per_connection: int
    max_waiting_bytes_per_connection: int


class Verdict(enum.Enum):
    ADMITTED = "admitted"  # run now
    WAITING = "waiting"  # run when ``leave`` hands the ticket back
    REFUSED = "refused"  # answer BROKER_BUSY; nothing was counted


@dataclass
class _Connection(Generic[T]):
    running: int = 0
    running_bytes: int = 0
    waiting: deque[tuple[T, int, int]] = field(default_factory=deque)  # ticket, cost, held
    waiting_bytes: int = 0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting


class Admission(Generic[T]):
    """The running and waiting requests of every connection."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._connections: dict[str, _Connection[T]] = {}
        self._total = 0  # running and waiting, over all connections
        self.refused = 0  # requests refused since start

    def arrive(
        self,
        connection: str,
        ticket: T,
        cost_bytes: int,
        held_bytes: int | None = None,
        *,
        may_refuse: bool = True,
    ) -> Verdict:
        """A request on ``connection`` that costs ``cost_bytes`` of its connection's in-flight
        bytes while it runs, and holds ``held_bytes`` (default: the cost) of memory while it
        waits: a pull's cost is the answer it may get, but waiting it holds only its request.
        ``may_refuse=False`` is for work the connection already had admitted once (a long poll
        back from its wait): it waits rather than be refused."""
        held = cost_bytes if held_bytes is None else held_bytes
        lim = self.limits
        if may_refuse and self._total >= lim.max_concurrent_rpcs:
            self.refused += 1
            return Verdict.REFUSED
        c = self._connections.get(connection)
        if c is None:
            c = self._connections[connection] = _Connection()
        if not c.waiting and self._fits(c, cost_bytes):
            c.running += 1
            c.running_bytes += cost_bytes
            self._total += 1
            return Verdict.ADMITTED
        if may_refuse and (
            len(c.waiting) >= lim.max_waiting_requests_per_connection
            # One request larger than the bound may wait alone, as it may run alone.
            or (c.waiting and c.waiting_bytes + held > lim.max_waiting_bytes_per_connection)
        ):
            self.refused += 1
            return Verdict.REFUSED
        c.waiting.append((ticket, cost_bytes, held))
        c.waiting_bytes += held
        self._total += 1
        return Verdict.WAITING

    def leave(self, connection: str, cost_bytes: int) -> list[T]:
        """A running request finished (or stepped aside); returns the tickets of the waiting
        requests that run now, in arrival order."""
        c = self._connections[connection]
        c.running -= 1
        c.running_bytes -= cost_bytes
        self._total -= 1
        admitted: list[T] = []
        while c.waiting and self._fits(c, c.waiting[0][1]):
            ticket, cost, held = c.waiting.popleft()
            c.waiting_bytes -= held
            c.running += 1
            c.running_bytes += cost
            admitted.append(ticket)
        if c.idle:
            del self._connections[connection]
        return admitted

    def hold(self, connection: str) -> None:
        """Hold the connection back: a place of its running requests is taken, by nothing,
        until ``leave(connection, 0)``."""
        c = self._connections.get(connection)
        if c is None:
            c = self._connections[connection] = _Connection()
        c.running += 1
        self._total += 1

    def withdraw(self, connection: str, ticket: T) -> bool:
        """A waiting request gave up (its caller cancelled). False if it is not waiting: it was
        admitted meanwhile, and must ``leave`` like any running request."""
        c = self._connections.get(connection)
        if c is None:
            return False
        for i, (t, _cost, held) in enumerate(c.waiting):
            if t is ticket:
                del c.waiting[i]
                c.waiting_bytes -= held
                self._total -= 1
                if c.idle:
                    del self._connections[connection]
                return True
        return False

    def _fits(self, c: _Connection[T], cost_bytes: int) -> bool:
        lim = self.limits
        if c.running >= lim.max_inflight_requests_per_connection:
            return False
        return (
            not c.running or c.running_bytes + cost_bytes <= lim.max_inflight_bytes_per_connection
        )

    # ------------------------------------------------------------------ for metrics and tests
    def running(self, connection: str) -> tuple[int, int]:
        """(requests, bytes) running for ``connection``."""
        c = self._connections.get(connection)
        return (c.running, c.running_bytes) if c is not None else (0, 0)

    def waiting(self, connection: str) -> tuple[int, int]:
        """(requests, bytes) waiting for ``connection``."""
        c = self._connections.get(connection)
        return (len(c.waiting), c.waiting_bytes) if c is not None else (0, 0)

    def idle(self, connection: str) -> bool:
        """Nothing of ``connection`` running, held back or waiting."""
        return connection not in self._connections

    @property
    def total(self) -> int:
        """Requests running or waiting over all connections."""
        return self._total

    @property
    def connections(self) -> int:
        return len(self._connections)


class ByteRateQuota:
    """How fast each connection may move bytes (requests in, answers out) while other
    connections are active: a connection over its rate is held back for as long as it takes to
    get under it again, as Kafka's client quotas do. A connection alone on the broker is never
    held back (nothing waits for it to slow down), so one client may still use all of it.

    A token bucket per connection, refilled at ``bytes_per_second`` up to a quarter second's
    worth; a call is charged when it ends, and may take the bucket below zero (a large answer);
    the debt is what holds the connection back.
    """

    ACTIVE_WINDOW_MS = 1_000  # another connection seen this recently is active
    MAX_BUCKETS = 4_096  # past this many, full buckets are dropped

    def __init__(self, bytes_per_second: int) -> None:
        self.bytes_per_second = bytes_per_second
        self.burst_bytes = max(bytes_per_second // 4, 1)
        self._buckets: dict[str, tuple[float, int]] = {}  # connection -> (tokens, at_ms)
        # The two connections seen last, most recent first: enough to tell whether any
        # connection other than a given one was seen within the window.
        self._recent: list[tuple[str, int]] = []
        self.held_back_ms = 0  # total, for metrics and tests

    def seen(self, connection: str, now_ms: int) -> None:
        """A call arrived on ``connection``."""
        rest = [r for r in self._recent if r[0] != connection]
        self._recent = [(connection, now_ms), *rest[:1]]

    def charge(self, connection: str, nbytes: int, now_ms: int) -> int:
        """A call of ``connection`` moved ``nbytes``; returns how long (ms) to hold the
        connection back (0: not at all)."""
        if len(self._buckets) >= self.MAX_BUCKETS:
            self._prune(now_ms)
        tokens, at_ms = self._buckets.get(connection, (float(self.burst_bytes), now_ms))
        tokens = min(
            float(self.burst_bytes), tokens + self.bytes_per_second * (now_ms - at_ms) / 1000
        )
        tokens -= nbytes
        if tokens < 0 and not self._others_active(connection, now_ms):
            tokens = 0.0  # alone: nothing to be fair to, and no debt carried into company
        if tokens >= self.burst_bytes:
            self._buckets.pop(connection, None)  # full again: as good as new
        else:
            self._buckets[connection] = (tokens, now_ms)
        if tokens >= 0:
            return 0
        delay_ms = int(-tokens * 1000 / self.bytes_per_second) + 1
        self.held_back_ms += delay_ms
        return delay_ms

    def _prune(self, now_ms: int) -> None:
        """Drop the buckets that have filled up again (connections long quiet or gone)."""
        rate = self.bytes_per_second
        full = [
            c
            for c, (tokens, at_ms) in self._buckets.items()
            if tokens + rate * (now_ms - at_ms) / 1000 >= self.burst_bytes
        ]
        for c in full:
            del self._buckets[c]

    def _others_active(self, connection: str, now_ms: int) -> bool:
        return any(c != connection and now_ms - t < self.ACTIVE_WINDOW_MS for c, t in self._recent)
