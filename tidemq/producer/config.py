"""The producer's settings, checked when it is built, and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings

if TYPE_CHECKING:
    from tidemq.metrics import ClientMetrics


@dataclass(frozen=True)
class ProducerConfig:
    group: str = "DEFAULT_PRODUCER"
    batch_max_messages: int = 1024
    batch_max_bytes: int = 1 << 20
    linger_ms: float = 0.0
    max_in_flight_per_broker: int = 4
    # Blocking ``send_async`` waits while this many messages are unanswered (memory bound).
    buffer_max_messages: int = 65_536
    send_timeout_ms: int = 10_000  # per message, retries included
    retries: int = 2
    route_refresh_ms: int = 30_000
    failure_isolation_ms: int = 30_000
    # Idempotent sends (docs/production.md): the broker stores a retried message once. A
    # random producer id per producer, or ``producer_id`` (1 .. 2**63-1) to keep one across
    # restarts. An idempotent attempt that takes longer than attempt_timeout_ms is abandoned
    # and retried on the same queue (safe: a retry of a stored message is answered, not
    # stored again), until send_timeout_ms.
    idempotent: bool = True
    producer_id: int | None = None
    attempt_timeout_ms: int = 3_000
    # Plain messages (no message group, no delayed delivery, not transactional) travel as
    # record blocks: encoded once, here, as the CommitLog records the broker stores
    # (docs/sdk.md, "Record blocks"). False sends them one protobuf message each, as
    # producers before blocks did: for brokers older than blocks (upgrade brokers first).
    record_blocks: bool = True
    # TLS (docs/security.md): TlsSettings (a CA, and a client certificate for mutual TLS), True
    # (the system's roots), False (plaintext), or None: the TIDEMQ_TLS_* variables decide.
    tls: TlsSettings | bool | None = None
    # Credentials (docs/security.md): every request is signed with this access key and secret
    # key; False: none; None: the TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY variables decide.
    credentials: Credentials | bool | None = None
    # Prometheus metrics (``tidemq.metrics``, docs/sdk.md): None keeps none, at no cost.
    metrics: ClientMetrics | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "batch_max_messages",
            "batch_max_bytes",
            "max_in_flight_per_broker",
            "buffer_max_messages",
            "send_timeout_ms",
            "route_refresh_ms",
            "attempt_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        for name in ("linger_ms", "retries", "failure_isolation_ms"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.batch_max_messages > 1024:
            problems.append("batch_max_messages must be <= 1024 (the broker's limit)")
        if self.producer_id is not None and not 0 < self.producer_id < 1 << 63:
            problems.append("producer_id must be in 1 .. 2**63-1")
        if self.producer_id is not None and not self.idempotent:
            problems.append("producer_id is for idempotent producers")
        if problems:
            raise ValueError("invalid producer settings: " + "; ".join(problems))


@dataclass
class ProducerStats:
    """Counters since the producer started (messages count every attempt, retries included)."""

    requests: int = 0
    messages: int = 0
    failed_requests: int = 0

    @property
    def messages_per_request(self) -> float:
        return self.messages / self.requests if self.requests else 0.0
