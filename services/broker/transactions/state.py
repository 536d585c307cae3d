"""The open transactions: halves not yet resolved, with their checks. Pure state, built by
applying the half records and the op log's events in order (``log``), and the checker's
decision (``due``). One small entry per open transaction; resolved ones are forgotten.

The two logs are followed one after the other, so an op record may be read before the half it
resolves (both dispatched between the two reads): such a resolution waits in ``_ahead`` until
its half arrives. A resolution of a half before every half read is of one resolved already, or
of one retention deleted: it is dropped."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidemq.services.broker.transactions.events import Checked, Event, Resolved


@dataclass
class OpenHalf:
    offset: int  # the half's CommitLog offset: the transaction's identity
    queue_offset: int  # in %SYS%TRANS_HALF queue 0 (what retention is pinned by)
    group: str
    topic: str
    queue_id: int
    msg_id: str
    stored_at_ms: int
    checks: int = 0
    last_check_ms: int = 0


class Action(enum.Enum):
    CHECK = "check"
    EXHAUSTED = "exhausted"


class OpenTransactions:
    def __init__(self) -> None:
        self.open: dict[int, OpenHalf] = {}  # by offset, in log order
        self.halves_end = 0  # CommitLog offset just past the last half applied
        self._ahead: set[int] = set()

    def __len__(self) -> int:
        return len(self.open)

    def add_half(self, half: OpenHalf, end_offset: int) -> None:
        self.halves_end = max(self.halves_end, end_offset)
        if half.offset in self._ahead:
            self._ahead.discard(half.offset)
            return
        self.open[half.offset] = half

    def apply(self, event: Event) -> None:
        h = self.open.get(event.half_offset)
        if isinstance(event, Resolved):
            if h is not None:
                del self.open[event.half_offset]
            elif event.half_offset >= self.halves_end:
                self._ahead.add(event.half_offset)
        elif isinstance(event, Checked) and h is not None:
            h.checks = max(h.checks, event.number)
            h.last_check_ms = max(h.last_check_ms, event.at_ms)

    def was_half(self, offset: int) -> bool:
        """Whether ``offset`` lies among the halves applied (then, not open: resolved)."""
        return offset < self.halves_end

    def oldest(self) -> OpenHalf | None:
        for h in self.open.values():
            return h
        return None

    def due(
        self, now_ms: int, timeout_ms: int, interval_ms: int, max_checks: int
    ) -> list[tuple[OpenHalf, Action]]:
        """What the checker does now: halves open longer than ``timeout_ms`` and not checked
        within ``interval_ms`` are checked, or, after ``max_checks`` checks, resolved by the
        configured resolution."""
        out = []
        for h in list(self.open.values()):
            if now_ms - h.stored_at_ms < timeout_ms:
                continue
            if h.checks and now_ms - h.last_check_ms < interval_ms:
                continue
            out.append((h, Action.EXHAUSTED if h.checks >= max_checks else Action.CHECK))
        return out

    def listing(self, group: str | None, limit: int) -> tuple[list[OpenHalf], int]:
        matching = [h for h in self.open.values() if group is None or h.group == group]
        return matching[:limit], len(matching)
