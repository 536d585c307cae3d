"""Settings of the receive/ack consumers (``SimpleConsumer``, ``PushConsumer``), checked once
when a consumer is built, and the subscriptions they take (topic -> tag expression)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.errors import InvalidArgumentError
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings

if TYPE_CHECKING:
    from tidemq.metrics import ClientMetrics


@dataclass(frozen=True)
class SimpleConsumerConfig:
    # Where a queue the group never received from starts: "first", "last" or a timestamp in ms.
    start_from: str | int = "last"
    # How long a receive waits at most for messages (long polling) when it names no timeout.
    long_poll_ms: int = 5_000
    heartbeat_interval_ms: int = 10_000
    route_refresh_ms: int = 30_000
    # Acks, nacks and changes retry retriable errors (a failover, a busy broker) this long.
    request_timeout_ms: int = 10_000
    client_id: str = ""  # default: host@pid@random
    # TLS (docs/security.md): TlsSettings (a CA, and a client certificate for mutual TLS), True
    # (the system's roots), False (plaintext), or None: the TIDEMQ_TLS_* variables decide.
    tls: TlsSettings | bool | None = None
    # Credentials (docs/security.md): every request is signed with this access key and secret
    # key; False: none; None: the TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY variables decide.
    credentials: Credentials | bool | None = None
    # Tracing (docs/sdk.md): an OpenTelemetry TracerProvider; None: the global one (spans only
    # when an SDK is configured).
    tracer_provider: Any = field(default=None, compare=False)
    # Prometheus metrics (``tidemq.metrics``, docs/sdk.md): None keeps none, at no cost.
    metrics: ClientMetrics | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problems = _common_problems(self)
        if problems:
            raise ValueError("invalid simple consumer settings: " + "; ".join(problems))


@dataclass(frozen=True)
class PushConsumerConfig:
    start_from: str | int = "last"
    # Listeners running at once (messages being consumed).
    max_concurrency: int = 16
    # Messages received ahead of a free listener, so listeners never wait on a receive call.
    # A buffered message's invisibility runs from its receipt and is renewed like a running
    # listener's (consume_timeout_ms counts from receipt too); 0: receive only what can start.
    buffer_messages: int = 64
    # Messages asked for per receive call (fewer when the listeners and buffer are nearly full).
    receive_batch_size: int = 64
    invisible_duration_s: float = 30.0
    # Renew the invisibility of a message whose listener is still running, a third of
    # invisible_duration_s before it ends; for at most consume_timeout_ms (RocketMQ's
    # consumeTimeout), after which the message is delivered again.
    auto_renew: bool = True
    consume_timeout_ms: int = 900_000
    # Acks are sent in batches: when this many are waiting, or ack_linger_ms after the first.
    ack_batch_max_messages: int = 256
    ack_linger_ms: int = 20
    long_poll_ms: int = 20_000
    heartbeat_interval_ms: int = 10_000
    route_refresh_ms: int = 30_000
    request_timeout_ms: int = 10_000
    # close() waits this long for running listeners before it gives up on them (their
    # messages are then delivered again after their invisibility).
    shutdown_timeout_ms: int = 30_000
    client_id: str = ""
    # TLS (docs/security.md): TlsSettings (a CA, and a client certificate for mutual TLS), True
    # (the system's roots), False (plaintext), or None: the TIDEMQ_TLS_* variables decide.
    tls: TlsSettings | bool | None = None
    # Credentials (docs/security.md): every request is signed with this access key and secret
    # key; False: none; None: the TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY variables decide.
    credentials: Credentials | bool | None = None
    # Tracing (docs/sdk.md): as SimpleConsumerConfig's.
    tracer_provider: Any = field(default=None, compare=False)
    # Prometheus metrics (``tidemq.metrics``, docs/sdk.md): None keeps none, at no cost.
    metrics: ClientMetrics | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problems = _common_problems(self)
        for name in (
            "max_concurrency",
            "receive_batch_size",
            "consume_timeout_ms",
            "ack_batch_max_messages",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        for name in ("buffer_messages", "ack_linger_ms", "shutdown_timeout_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.long_poll_ms == 0:
            # The receive loop would ask again at once, all the time, while nothing comes.
            problems.append("long_poll_ms must be > 0 for a push consumer")
        try:
            invisible_ms(self.invisible_duration_s)
        except InvalidArgumentError as e:
            problems.append(e.args[0])
        if problems:
            raise ValueError("invalid push consumer settings: " + "; ".join(problems))


def _common_problems(config: SimpleConsumerConfig | PushConsumerConfig) -> list[str]:
    problems = []
    start = config.start_from
    if not (start in ("first", "last") or _is_timestamp(start)):
        problems.append("start_from must be 'first', 'last' or a timestamp in ms")
    for name in ("heartbeat_interval_ms", "route_refresh_ms", "request_timeout_ms"):
        if getattr(config, name) <= 0:
            problems.append(f"{name} must be > 0")
    if config.long_poll_ms < 0:
        problems.append("long_poll_ms must be >= 0")
    return problems


def _is_timestamp(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def start_from_text(start: str | int) -> str:
    """``start_from`` as ReceiveMessageRequest carries it."""
    return start if isinstance(start, str) else str(start)


def invisible_ms(seconds: float) -> int:
    """An invisible duration in ms; zero, negative, NaN and infinite ones are refused here (the
    broker refuses those outside its limits, by default 1 s to 12 h)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgumentError(
            f"invisible duration must be a number of seconds, not {type(seconds).__name__}",
            code="INVALID_ARGUMENT",
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgumentError(
            f"invisible duration must be > 0 seconds, not {seconds!r}", code="INVALID_ARGUMENT"
        )
    return max(1, round(seconds * 1000))


def subscriptions_of(subscriptions: Mapping[str, str] | str) -> dict[str, str]:
    """``"orders"`` (every tag) or ``{"orders": "created || paid", ...}`` -> topic -> tag
    expression, sorted by topic."""
    if isinstance(subscriptions, str):
        subscriptions = {subscriptions: "*"}
    if not isinstance(subscriptions, Mapping) or not subscriptions:
        raise ValueError("subscriptions: a topic, or a mapping of topic -> tag expression")
    out: dict[str, str] = {}
    for topic in sorted(subscriptions):
        expression = subscriptions[topic]
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"subscription topic must be a non-empty string, not {topic!r}")
        if not isinstance(expression, str):
            raise TypeError(f"tag expression of {topic!r} must be a string")
        out[topic] = expression.strip() or "*"
    return out
