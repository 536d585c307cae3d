"""How long a failed delivery waits before the message is delivered again.

A consumer group's policy is either a list of delays (RocketMQ's 18 levels by default: the
delay after delivery number n is the n-th entry, the last one repeating) or exponential
(``initial_ms * multiplier ** (n - 1)``, capped at ``max_ms``) when the list is empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tidemq.protos import broker_pb2

DEFAULT_DELAYS_MS: tuple[int, ...] = (
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
)
DEFAULT_MAX_DELIVERY_ATTEMPTS = 16
# A delay longer than a week is a typo, not a policy (and keeps every sum far from overflow).
MAX_DELAY_MS = 7 * 24 * 3_600_000
MAX_DELAY_COUNT = 1000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff of a consumer group; ``delays_ms`` non-empty wins over the exponential fields."""

    delays_ms: tuple[int, ...] = DEFAULT_DELAYS_MS
    initial_ms: int = 1_000
    max_ms: int = 7_200_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        # A list from a caller is taken as the tuple it means (the policy stays hashable).
        object.__setattr__(self, "delays_ms", tuple(self.delays_ms))
        if len(self.delays_ms) > MAX_DELAY_COUNT:
            raise ValueError(f"at most {MAX_DELAY_COUNT} retry delays, got {len(self.delays_ms)}")
        for d in self.delays_ms:
            _check_delay("retry delay", d)
        _check_delay("initial retry delay", self.initial_ms)
        _check_delay("maximum retry delay", self.max_ms)
        if self.max_ms < self.initial_ms:
            raise ValueError(
                f"maximum retry delay {self.max_ms} ms is below the initial {self.initial_ms} ms"
            )
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m) or m < 1:
            raise ValueError(f"retry multiplier must be a finite number >= 1, got {m!r}")

    def delay_ms(self, attempt: int) -> int:
        """The wait after delivery number ``attempt`` (1 = the first delivery) failed."""
        if attempt < 1:
            raise ValueError(f"delivery attempt starts at 1, got {attempt}")
        if self.delays_ms:
            return self.delays_ms[min(attempt, len(self.delays_ms)) - 1]
        try:
            grown = self.initial_ms * self.multiplier ** (attempt - 1)
        except OverflowError:
            return self.max_ms
        return self.max_ms if grown >= self.max_ms else int(grown)

    @classmethod
    def from_proto(cls, p: Any) -> RetryPolicy:
        """A policy from its proto; a field left at zero takes its default (empty -> defaults)."""
        delays = tuple(int(d) for d in p.delays_ms)
        if not delays and not (p.initial_ms or p.max_ms or p.multiplier):
            return cls()
        return cls(
            delays_ms=delays,
            initial_ms=int(p.initial_ms) or 1_000,
            max_ms=int(p.max_ms) or 7_200_000,
            multiplier=float(p.multiplier) or 2.0,
        )

    def to_proto(self) -> Any:
        return broker_pb2.RetryPolicy(
            delays_ms=list(self.delays_ms),
            initial_ms=self.initial_ms,
            max_ms=self.max_ms,
            multiplier=self.multiplier,
        )


def _check_delay(what: str, value: object) -> None:
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not (whole and 0 < value <= MAX_DELAY_MS):  # type: ignore[operator]
        raise ValueError(f"{what} must be whole milliseconds in (0, {MAX_DELAY_MS}], got {value!r}")
