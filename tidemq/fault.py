"""Latency fault tolerance (RocketMQ's ``LatencyFaultToleranceImpl``) as pure state.

A broker group that just failed a send, or answered very slowly, is avoided for a while so the
next attempts go elsewhere. The clock is passed in, so the rules are tested without waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# RocketMQ's table: a send slower than LATENCY_MS[i] isolates its broker for ISOLATION_MS[i].
LATENCY_MS: Sequence[int] = (50, 100, 550, 1_000, 2_000, 3_000, 15_000)
ISOLATION_MS: Sequence[int] = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)


@dataclass(frozen=True)
class FaultToleranceConfig:
    failure_isolation_ms: int = 30_000  # after a retriable failure

    def __post_init__(self) -> None:
        if self.failure_isolation_ms < 0:
            raise ValueError("failure_isolation_ms must be >= 0")


class LatencyFaultTolerance:
    def __init__(self, config: FaultToleranceConfig | None = None) -> None:
        self.config = config or FaultToleranceConfig()
        self._until_ms: dict[str, int] = {}

    def record_latency(self, broker: str, latency_ms: float, now_ms: int) -> None:
        isolation = 0
        for limit, duration in zip(LATENCY_MS, ISOLATION_MS, strict=True):
            if latency_ms >= limit:
                isolation = duration
        if isolation:
            self._isolate(broker, now_ms + isolation)

    def record_failure(self, broker: str, now_ms: int) -> None:
        self._isolate(broker, now_ms + self.config.failure_isolation_ms)

    def record_success(self, broker: str) -> None:
        """A fast answer: whatever happened before, the broker works now."""
        self._until_ms.pop(broker, None)

    def _isolate(self, broker: str, until_ms: int) -> None:
        self._until_ms[broker] = max(self._until_ms.get(broker, 0), until_ms)

    def is_available(self, broker: str, now_ms: int) -> bool:
        return self._until_ms.get(broker, 0) <= now_ms

    def pick_least_bad(self, brokers: Iterable[str]) -> str | None:
        """When every candidate is isolated: the one whose isolation ends first."""
        return min(brokers, key=lambda b: self._until_ms.get(b, 0), default=None)
