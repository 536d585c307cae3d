"""The timer log: ``%SYS%TIMER_LOG`` queue 0 holds the timer's events (``Fired``,
``Recalled``), and ``TimerProgress`` is what applying them in order gives.

The master appends an event (in the put of the messages it stands for, after them) and applies
it in the same step of the event loop (``applied_put``); slaves apply the replicated records as
dispatch publishes them, and a broker promoted to master applies every record its log holds
before it fires or recalls anything (``event_log.FollowedLog``, shared with the receive log).
The progress is tiny (a mark, a low sequence, recalled ids still pending), so there is no
snapshot: a rebuild replays the log from its first retained record. Retention keeps what a
replay needs: the oldest pending timer record is pinned (``low_position``), and every
``Recalled`` of a pending timer comes after it; the newest record, where the last ``Fired`` is,
is pinned too (``newest_position``).
"""

from __future__ import annotations

import logging

from tidemq.services.broker.event_log import FollowedLog, LogMark
from tidemq.services.broker.timer.events import (
    TIMER_LOG_TOPIC,
    TimerEvent,
    TimerEventFormatError,
    decode_timer_event,
    encode_timer_event,
)
from tidemq.services.broker.timer.progress import TimerProgress
from tidemq.storage import Message, MessageStore
from tidemq.storage.record import TIMER_TOPIC

log = logging.getLogger(__name__)

LOG_QUEUE = 0


class TimerJournal(FollowedLog[TimerEvent]):
    format_error = TimerEventFormatError
    state_name = "progress"

    def __init__(self, store: MessageStore) -> None:
        super().__init__(store, TIMER_LOG_TOPIC, LOG_QUEUE, "timer log")
        self.progress = TimerProgress()

    def event_record(self, event: TimerEvent) -> Message:
        return Message(topic=TIMER_LOG_TOPIC, queue_id=LOG_QUEUE, body=encode_timer_event(event))

    # ------------------------------------------------------------------ start-up
    def _rebuild(self, why: str) -> None:
        self.progress = TimerProgress()
        self.mark = LogMark(self.store.min_offset(TIMER_LOG_TOPIC, LOG_QUEUE))
        self._apply_all()
        log.info(
            "timer progress rebuilt (%s): delivered up to %d, low sequence %d, log position %d",
            why,
            self.progress.delivered_up_to_ms,
            self.progress.low_seq,
            self.mark.next_offset,
        )

    # ------------------------------------------------------------------ applying
    def _decode(self, body: bytes) -> TimerEvent:
        return decode_timer_event(body)

    def _apply(self, event: TimerEvent, phy_offset: int) -> None:
        self.progress.apply(event)

    # ------------------------------------------------------------------ retention
    def low_position(self) -> tuple[str, int, int]:
        """The oldest timer record still pending, as a queue position retention keeps (from the
        store's housekeeping thread)."""
        return TIMER_TOPIC, 0, self.progress.low_seq

    def newest_position(self) -> tuple[str, int, int] | None:
        """The newest record of the log (its last ``Fired`` mark lives there or after it)."""
        end = self.store.max_offset(TIMER_LOG_TOPIC, LOG_QUEUE)
        return (TIMER_LOG_TOPIC, LOG_QUEUE, end - 1) if end > 0 else None
