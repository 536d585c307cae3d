"""Test helpers for the receive core: a queue of messages to read from, and a journal-like
driver that plans, records and applies events as the broker's journal does."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.services.broker.receive.due_index import HELD, RELEASED
from tidemq.services.broker.receive.events import Event, QueueKey
from tidemq.services.broker.receive.queue_state import (
    Candidate,
    QueueInFlight,
    ReceivePlan,
)
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.receive.states import ReceiveStates

KEY = QueueKey("g", "t", 0)


@dataclass
class MessageLog:
    """Messages of one queue from offset 0: (tag matches, message group hash)."""

    messages: list[tuple[bool, int]] = field(default_factory=list)
    reads: int = 0

    def add(self, count: int = 1, *, matches: bool = True, group: int = 0) -> None:
        self.messages.extend([(matches, group)] * count)

    def read(self, from_offset: int, max_count: int) -> list[Candidate]:
        self.reads += 1
        end = min(len(self.messages), from_offset + max_count)
        return [
            Candidate(o, self.messages[o][0], self.messages[o][1], f"m{o}")
            for o in range(from_offset, end)
        ]


@dataclass
class Driver:
    """Plans on a queue's state, appends the events to a list (the 'log', lease id = index
    * 100 + 1000, increasing as CommitLog offsets) and applies them, as the journal does."""

    log: MessageLog = field(default_factory=MessageLog)
    policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(delays_ms=(1_000,)))
    fifo: bool = False
    max_attempts: int = 16
    max_held: int = 10_000
    states: ReceiveStates = field(default_factory=ReceiveStates)
    events: list[tuple[Event, int]] = field(default_factory=list)
    next_lease: int = 1000

    def append(self, ev: Event) -> int:
        lease = self.next_lease
        self.next_lease += 100
        self.events.append((ev, lease))
        self.states.apply(ev, lease)
        return lease

    @property
    def q(self) -> QueueInFlight:
        q = self.states.get(KEY)
        assert q is not None
        return q

    def plan(self, now_ms: int, n: int = 16) -> ReceivePlan | None:
        return self.q.plan_receive(
            now_ms,
            n,
            self.log,
            fifo=self.fifo,
            max_attempts=self.max_attempts,
            policy=self.policy,
            max_held=self.max_held,
        )

    def receive(
        self, now_ms: int, n: int = 16, invisible_ms: int = 30_000
    ) -> tuple[int, list[tuple[int, int, int, object | None]]]:
        """(lease id, delivered) of one receive; (0, []) when there was nothing to record."""
        plan = self.plan(now_ms, n)
        if plan is None:
            return 0, []
        lease = self.append(plan.event(KEY, now_ms, now_ms + invisible_ms))
        return lease, plan.delivered

    def offsets(self, now_ms: int, n: int = 16, invisible_ms: int = 30_000) -> list[int]:
        return [o for o, *_ in self.receive(now_ms, n, invisible_ms)[1]]


def walk_retries(
    q: QueueInFlight, now_ms: int, max_messages: int, max_attempts: int, policy: RetryPolicy
) -> list[int]:
    """What a receive redelivers, by walking every open entry (the reference for the index)."""
    return [
        o
        for o, s in q.items()
        if s.kind != HELD and s.attempt < max_attempts and s.deliverable_at(policy) <= now_ms
    ][:max_messages]


def walk_dead(q: QueueInFlight, now_ms: int, max_attempts: int) -> list[tuple[int, int]]:
    return [
        (o, s.lease_id)
        for o, s in q.items()
        if s.kind != HELD
        and s.attempt >= max_attempts
        and (s.kind == RELEASED or now_ms >= s.until_ms)
    ]


def walk_next_visible(
    q: QueueInFlight, now_ms: int, max_attempts: int, policy: RetryPolicy
) -> int | None:
    times = [
        s.deliverable_at(policy)
        for _, s in q.items()
        if s.kind != HELD and s.attempt < max_attempts
    ]
    later = [t for t in times if t > now_ms]
    return min(later) if later else None


def walk_fifo_retries(
    q: QueueInFlight, now_ms: int, max_messages: int, max_attempts: int, policy: RetryPolicy
) -> list[int]:
    """What a FIFO receive delivers of the open entries, by walking them all: each message
    group's first open offset, when it is held or due; offsets without a group when due."""
    seen: set[int] = set()
    out: list[int] = []
    for o, s in q.items():
        gh = s.group_hash
        if gh:
            if gh in seen:
                continue
            seen.add(gh)
        if s.kind == HELD or (s.attempt < max_attempts and s.deliverable_at(policy) <= now_ms):
            out.append(o)
    return out[:max_messages]
