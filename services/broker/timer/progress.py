"""What the timer log's events say is done: the pure state master and slaves build alike by
applying ``%SYS%TIMER_LOG`` events in log order, and from which the wheel is rebuilt (a timer
record is pending when ``is_pending`` says so). Small by construction: two marks, and the
recalled timers that are not yet past the delivered mark, so no snapshot is needed: replaying
the log from its start (or from where retention left it) rebuilds it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.services.broker.timer.events import Fired, Recalled, TimerEvent


@dataclass
class TimerProgress:
    # Every timer due at or before this is delivered or recalled (-1: none yet).
    delivered_up_to_ms: int = -1
    # Every %SYS%TIMER queue offset below this is delivered or recalled.
    low_seq: int = 0
    # Recalled timers still ahead of the delivered mark: timer_id -> deliver_at_ms.
    recalled: dict[int, int] = field(default_factory=dict)

    def apply(self, event: TimerEvent) -> None:
        if isinstance(event, Fired):
            # Marks never move back: a Fired replayed twice (or late) changes nothing.
            self.low_seq = max(self.low_seq, event.low_seq)
            if event.up_to_ms > self.delivered_up_to_ms:
                self.delivered_up_to_ms = event.up_to_ms
                mark = event.up_to_ms
                self.recalled = {t: ms for t, ms in self.recalled.items() if ms > mark}
        elif isinstance(event, Recalled) and event.deliver_at_ms > self.delivered_up_to_ms:
            self.recalled[event.timer_id] = event.deliver_at_ms

    def is_pending(self, timer_id: int, due_ms: int, seq: int) -> bool:
        """Whether the timer record at ``seq`` (CommitLog offset ``timer_id``, due ``due_ms``)
        still has to be delivered."""
        return (
            seq >= self.low_seq
            and due_ms > self.delivered_up_to_ms
            and timer_id not in self.recalled
        )

    def is_recalled(self, timer_id: int) -> bool:
        return timer_id in self.recalled


def fired_mark(
    now_ms: int, next_due_ms: int | None, low_pending_seq: int | None, next_seq: int
) -> Fired:
    """The ``Fired`` to append with a batch of deliveries, from what is still pending once the
    batch is popped (the wheel's ``next_due_ms`` and ``low_seq``; ``next_seq`` is the
    ``%SYS%TIMER`` queue's end). The mark never claims a timer still pending: one due at the
    millisecond a batch stopped in (``max_entries``) holds it to the millisecond before."""
    up_to = now_ms if next_due_ms is None else min(now_ms, next_due_ms - 1)
    return Fired(up_to, next_seq if low_pending_seq is None else low_pending_seq)
