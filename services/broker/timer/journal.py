"""The timer log: ``%SYS%TIMER_LOG`` queue 0 holds the timer's events (``Fired``,
``Recalled``), and ``TimerProgress`` is what applying them in order gives.

The master appends an event and applies it in the same step of the event loop (``append``);
slaves apply the replicated records as dispatch publishes them (``follow``); a broker promoted
to master applies every record its log holds before it fires anything (``catch_up_fully``). The
progress is tiny (a mark, a low sequence, recalled ids still pending), so there is no snapshot:
a rebuild replays the log from its first retained record. Retention keeps what a replay needs:
the timer service pins the oldest pending timer record, and every ``Recalled`` of a pending
timer comes after it; the newest ``Fired`` is pinned too (``retention_positions``).

A log cut back under the state (a slave's diverged tail truncated, a tail lost before its
flush) is noticed as the receive journal notices it — the record the state ends with is gone
or different — and the progress is rebuilt.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable

from tidemq.services.broker.timer.events import (
    TIMER_LOG_TOPIC,
    TimerEvent,
    TimerEventFormatError,
    decode_timer_event,
    encode_timer_event,
)
from tidemq.services.broker.timer.progress import TimerProgress
from tidemq.storage import Message, MessageStore, PutResult, StoredMessage
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError
from tidemq.storage.record import TIMER_TOPIC

log = logging.getLogger(__name__)

LOG_QUEUE = 0
CATCH_UP_CHUNK = 512
_READ_BYTES = 4 << 20


class TimerLogBehindError(Exception):
    """An append found records of the timer log this broker has not applied before its own."""


class TimerJournal:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.progress = TimerProgress()
        # The next queue offset to apply, and the record the progress ends with (-1: none).
        self.next_offset = 0
        self._last_phy = -1
        self._last_crc = 0
        self.rebuilds = 0
        # Called with every event applied on the event loop (the service drops wheel entries).
        self.on_applied: Callable[[TimerEvent], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._behind = asyncio.Event()

    def event_record(self, event: TimerEvent) -> Message:
        return Message(topic=TIMER_LOG_TOPIC, queue_id=LOG_QUEUE, body=encode_timer_event(event))

    # ------------------------------------------------------------------ start-up
    def open(self) -> None:
        """Replay the log (blocking: the store is open, nothing serves yet)."""
        self.store.wait_dispatched(self.store.log.max_offset, 60)
        self._rebuild("start-up")

    def _rebuild(self, why: str) -> None:
        self.progress = TimerProgress()
        self.next_offset = self.store.min_offset(TIMER_LOG_TOPIC, LOG_QUEUE)
        self._last_phy, self._last_crc = -1, 0
        self._apply_all()
        log.info(
            "timer progress rebuilt (%s): delivered up to %d, low sequence %d, log position %d",
            why,
            self.progress.delivered_up_to_ms,
            self.progress.low_seq,
            self.next_offset,
        )

    # ------------------------------------------------------------------ the master
    def applied_put(self, put: PutResult, event: TimerEvent, body: bytes) -> None:
        """Apply ``event``, whose record is the last of ``put`` (the master, in the step of
        the put). Raises TimerLogBehindError when records before it are not applied yet."""
        r = put.results[-1]
        if r.queue_offset != self.next_offset:
            self._behind.set()
            raise TimerLogBehindError(
                f"timer log record at {r.queue_offset}, progress at {self.next_offset}"
            )
        self._apply(event)
        self._mark(r.queue_offset, r.phy_offset, body)

    def caught_up(self) -> bool:
        return self.store.max_offset(TIMER_LOG_TOPIC, LOG_QUEUE) <= self.next_offset

    async def catch_up_fully(self) -> None:
        """Before a promoted master fires or recalls: every record in its log, applied."""
        end = self.store.log.max_offset
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.store.wait_dispatched, end, 30.0)
        await self._catch_up_in_steps()

    async def _catch_up_in_steps(self) -> None:
        # A chunk per loop step: a long backlog does not hold up other calls.
        while self.catch_up(CATCH_UP_CHUNK):  # noqa: ASYNC110 - it applies, it does not poll
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ following the log
    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.add_dispatch_listener(self._dispatched)

    def _dispatched(self, topic: str, _queue_id: int, max_offset: int) -> None:
        if topic == TIMER_LOG_TOPIC and max_offset > self.next_offset and self._loop:
            self._loop.call_soon_threadsafe(self._behind.set)

    async def follow(self) -> None:
        while True:
            await self._behind.wait()
            self._behind.clear()
            try:
                await self._catch_up_in_steps()
            except Exception:  # logged; the next dispatch tries again
                log.exception("following the timer log failed")

    def catch_up(self, max_records: int) -> int:
        """Apply dispatched records after the applied position; returns how many. A log cut
        back under the progress rebuilds it first."""
        last = self._last_phy
        if last >= 0 and self.store.dispatched_offset <= last < self.store.log.max_offset:
            return 0  # the master's own record, applied at its put, not dispatched yet
        if not self._log_agrees() or (
            self.store.max_offset(TIMER_LOG_TOPIC, LOG_QUEUE) < self.next_offset
        ):
            self.rebuilds += 1
            self._rebuild("the log was cut back")
            return 0
        return self._apply_all(max_records)

    def _log_agrees(self) -> bool:
        if self._last_phy < 0:
            return self.store.min_offset(TIMER_LOG_TOPIC, LOG_QUEUE) <= self.next_offset
        got = self._read(self.next_offset - 1, 1)
        return bool(got) and (
            got[0].phy_offset == self._last_phy and zlib.crc32(got[0].body) == self._last_crc
        )

    def _apply_all(self, max_records: int | None = None) -> int:
        applied = 0
        while max_records is None or applied < max_records:
            want = CATCH_UP_CHUNK if max_records is None else min(CATCH_UP_CHUNK, max_records)
            got = self._read(self.next_offset, want)
            if not got:
                break
            for m in got:
                try:
                    event = decode_timer_event(m.body)
                except TimerEventFormatError as e:
                    log.error(  # noqa: TRY400 - the reason is the message
                        "timer log record at %d skipped: %s", m.phy_offset, e
                    )
                else:
                    self._apply(event)
                self._mark(m.queue_offset, m.phy_offset, m.body)
            applied += len(got)
        return applied

    def _apply(self, event: TimerEvent) -> None:
        self.progress.apply(event)
        if self.on_applied is not None:
            self.on_applied(event)

    def _mark(self, queue_offset: int, phy: int, body: bytes) -> None:
        self.next_offset = queue_offset + 1
        self._last_phy, self._last_crc = phy, zlib.crc32(body)

    def _read(self, offset: int, count: int) -> list[StoredMessage]:
        try:
            return self.store.get_messages(
                TIMER_LOG_TOPIC, LOG_QUEUE, offset, count, _READ_BYTES
            ).messages
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            return []

    def low_position(self) -> tuple[str, int, int]:
        """The oldest timer record still pending, as a queue position retention keeps (from the
        store's housekeeping thread)."""
        return TIMER_TOPIC, 0, self.progress.low_seq

    def newest_position(self) -> tuple[str, int, int] | None:
        """The newest record of the log (its last ``Fired`` mark lives there or after it)."""
        end = self.store.max_offset(TIMER_LOG_TOPIC, LOG_QUEUE)
        return (TIMER_LOG_TOPIC, LOG_QUEUE, end - 1) if end > 0 else None
