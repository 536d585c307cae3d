"""The consumer's settings, checked when it is built, and its default client id."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings

if TYPE_CHECKING:
    from tidemq.metrics import ClientMetrics


@dataclass(frozen=True)
class ConsumerConfig:
    mode: str = "clustering"  # or "broadcasting"
    tags: str = "*"
    start_from: str | int = "last"  # "first", "last", or a timestamp in ms (new groups only)
    auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    rebalance_interval_ms: int = 5_000
    heartbeat_interval_ms: int = 10_000
    pull_batch_size: int = 32
    pull_max_bytes: int = 4 << 20
    long_poll_ms: int = 10_000
    queue_buffer_messages: int = 1_024  # per queue: pulling pauses while the buffer is full
    route_refresh_ms: int = 30_000
    client_id: str = ""  # default: host@pid@random
    instance_name: str = "DEFAULT"  # names the local offset file in broadcasting mode
    local_offsets_dir: str = ""  # default: ~/.tidemq/offsets
    # A broker group's master that failed a call is left alone this long: pulls, commits and
    # offset queries go to its slaves meanwhile, then the master is tried again.
    master_retry_ms: int = 10_000
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
        if self.mode not in ("clustering", "broadcasting"):
            problems.append(f"mode must be 'clustering' or 'broadcasting', not {self.mode!r}")
        if not (self.start_from in ("first", "last") or _is_timestamp(self.start_from)):
            problems.append("start_from must be 'first', 'last' or a timestamp in ms")
        for name in (
            "auto_commit_interval_ms",
            "rebalance_interval_ms",
            "heartbeat_interval_ms",
            "pull_batch_size",
            "pull_max_bytes",
            "queue_buffer_messages",
            "route_refresh_ms",
            "master_retry_ms",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.long_poll_ms < 0:
            problems.append("long_poll_ms must be >= 0")
        if problems:
            raise ValueError("invalid consumer settings: " + "; ".join(problems))


def _is_timestamp(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
