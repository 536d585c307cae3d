"""The data version of a broker state table (RocketMQ's DataVersion): registrations and config
sync compare it to know whether, and since when, a table changed. ``topics`` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.storage.clock import now_ms


@dataclass
class DataVersion:
    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = 0

    def bump(self) -> None:
        self.counter += 1
        self.timestamp_ms = now_ms()
