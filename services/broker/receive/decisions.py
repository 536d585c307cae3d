"""What the in-flight state machine answers and reads: the status of a receipt handle, the
messages a receive looks at (``NewMessages``, implemented by the broker over its store) and
the plan of a receive, turned into its ``Received`` event by the caller."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from tidemq.services.broker.receive.events import QueueKey, Received, recorded_client_id


class HandleStatus(enum.Enum):
    OK = "ok"
    EXPIRED = "expired"  # its lease ended; nobody else has it yet
    ACKED = "acked"  # the message is done for the group (acked, dead-lettered, reset past)
    SUPERSEDED = "superseded"  # a later lease (renewal, redelivery, nack) replaced this one
    UNKNOWN = "unknown"  # never delivered under this lease (beyond the cursor, held, forged)


class Candidate(NamedTuple):
    offset: int
    matches: bool
    group_hash: int
    message: object  # opaque payload the reader wants back in the plan


class NewMessages(Protocol):
    def read(self, from_offset: int, max_count: int) -> list[Candidate]:
        """Up to ``max_count`` messages from ``from_offset`` on, in order; [] at the end."""
        ...


@dataclass(frozen=True, slots=True)
class ReceivePlan:
    # (offset, attempt, group hash, message or None for retries and held ones: read them)
    delivered: list[tuple[int, int, int, object | None]]
    filtered: tuple[int, ...]
    held: tuple[tuple[int, int], ...]
    cursor: int

    def event(
        self, key: QueueKey, now_ms: int, invisible_until_ms: int, client_id: str = ""
    ) -> Received:
        return Received(
            key,
            now_ms,
            invisible_until_ms,
            tuple((o, a, h) for o, a, h, _ in self.delivered),
            self.filtered,
            self.held,
            self.cursor,
            recorded_client_id(client_id),
        )
