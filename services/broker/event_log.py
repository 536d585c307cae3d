"""What every broker-written event log shares (the receive log, the timer log): one queue of a
``%SYS%`` topic whose records are events, and a state that is what applying them in order gives.

The master appends a record and applies its event in the same step of the event loop
(``applied_put``: refused with ``LogBehindError`` when records before it are not applied yet);
slaves apply replicated records as dispatch publishes them (``listen`` + ``follow``); a broker
promoted to master applies everything its log holds before it decides anything
(``catch_up_fully``). A log cut back under the state (a slave's
diverged tail truncated, a tail lost to a power cut before its flush) is noticed — the record
the state ends with is gone or different — and the subclass rebuilds the state (``_rebuild``).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from tidemq.storage import MessageStore, PutResult, StoredMessage
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

log = logging.getLogger(__name__)

# Records applied per step of a catch-up on the event loop, between yields to other calls.
CATCH_UP_CHUNK = 512
_READ_BYTES = 8 << 20

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class LogMark:
    """How far the applied state has read its log: ``next_offset`` is the next queue offset of
    the log to apply; ``last_phy`` and ``last_crc`` name the record just before it (-1 and 0
    when the state holds no record)."""

    next_offset: int
    last_phy: int = -1
    last_crc: int = 0


class LogBehindError(Exception):
    """An append found records of the log this broker has not applied before its own."""


class FollowedLog(ABC, Generic[E]):
    """The log's position and how it is followed; the state, its events and its rebuild are
    the subclass's."""

    # What ``_decode`` raises for a record it cannot decode.
    format_error: ClassVar[type[ValueError]]
    # What the applied state is called, in a LogBehindError.
    state_name: ClassVar[str] = "state"

    def __init__(self, store: MessageStore, topic: str, queue_id: int, what: str) -> None:
        self.store = store
        self.topic = topic
        self.queue_id = queue_id
        self.what = what  # "receive log", in log lines
        self.mark = LogMark(0)
        self.rebuilds = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._behind = asyncio.Event()

    @abstractmethod
    def _rebuild(self, why: str) -> None:
        """Rebuild the state from the log as it is now (blocking)."""

    @abstractmethod
    def _decode(self, body: bytes) -> E:
        """One record's event; raises ``format_error``."""

    @abstractmethod
    def _apply(self, event: E, phy_offset: int) -> None:
        """Apply the event of the record at ``phy_offset``."""

    def open(self) -> None:
        """Rebuild the state from the log as stored (blocking: the store is open, nothing
        serves yet)."""
        self.store.wait_dispatched(self.store.log.max_offset, 60)
        self._rebuild("start-up")

    def _apply_body(self, body: bytes, phy_offset: int) -> None:
        try:
            event = self._decode(body)
        except self.format_error as e:
            # Written by a newer broker, or damaged: skipping it keeps the rest in order.
            log.error(  # noqa: TRY400 - the reason is the message; no traceback helps
                "%s record at %d skipped: %s", self.what, phy_offset, e
            )
        else:
            self._apply(event, phy_offset)

    # ------------------------------------------------------------------ the master
    def in_order(self, queue_offset: int) -> bool:
        """Whether the master's own new record at ``queue_offset`` is the next to apply; when
        not, the next catch-up applies it in its place."""
        if queue_offset == self.mark.next_offset:
            return True
        self._behind.set()
        return False

    def applied_put(self, put: PutResult, event: E, body: bytes) -> None:
        """Apply ``event``, whose record (``body``) is the last of ``put`` (the master, in the
        step of the put). Raises LogBehindError when records before it are not applied yet."""
        r = put.results[-1]
        if not self.in_order(r.queue_offset):
            raise LogBehindError(
                f"{self.what} record at {r.queue_offset}, "
                f"{self.state_name} at {self.mark.next_offset}"
            )
        self._apply(event, r.phy_offset)
        self.applied(r.queue_offset, r.phy_offset, body)

    def applied(self, queue_offset: int, phy_offset: int, body: bytes) -> None:
        self.mark = LogMark(queue_offset + 1, phy_offset, zlib.crc32(body))

    def caught_up(self) -> bool:
        """Whether every record of the log (as dispatched) is applied."""
        return self.store.max_offset(self.topic, self.queue_id) <= self.mark.next_offset

    async def catch_up_fully(self) -> None:
        """Before a promoted master decides anything: every record in its log, applied."""
        end = self.store.log.max_offset
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.store.wait_dispatched, end, 30.0)
        await self._catch_up_in_steps()

    async def _catch_up_in_steps(self) -> None:
        # A chunk per step of the loop: a long backlog does not hold up other calls.
        applied = self.catch_up(CATCH_UP_CHUNK)
        while applied:
            await asyncio.sleep(0)
            applied = self.catch_up(CATCH_UP_CHUNK)

    # ------------------------------------------------------------------ following the log
    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow the log as dispatch publishes it (call once, before the store takes records)."""
        self._loop = loop
        self.store.add_dispatch_listener(self._dispatched)

    def _dispatched(self, topic: str, _queue_id: int, max_offset: int) -> None:
        # The dispatch thread. The master applies its own records before they are dispatched,
        # so for it this never wakes the loop.
        if topic == self.topic and max_offset > self.mark.next_offset and self._loop:
            self._loop.call_soon_threadsafe(self._behind.set)

    async def follow(self) -> None:
        """Apply records as they are dispatched, a chunk per loop step, for as long as the
        broker runs."""
        while True:
            await self._behind.wait()
            self._behind.clear()
            try:
                await self._catch_up_in_steps()
            except Exception:  # logged; the next dispatch tries again
                log.exception("following the %s failed", self.what)

    def catch_up(self, max_records: int | None = None) -> int:
        """Apply dispatched records after the applied position (at most ``max_records``);
        returns how many. A log cut back under the state rebuilds it first."""
        if self._ahead_of_dispatch():
            return 0
        if not self._log_agrees(self.mark) or (
            self.store.max_offset(self.topic, self.queue_id) < self.mark.next_offset
        ):
            self.rebuilds += 1
            self._rebuild("the log was cut back")
            return 0
        return self._apply_all(max_records)

    def _ahead_of_dispatch(self) -> bool:
        """Whether the state ends with a record the log holds but dispatch has not published
        yet: a master's own, applied as it appended it. Not a log cut back, nothing to apply
        (a rebuild now would replay without it, and decide on a state that lacks it)."""
        last = self.mark.last_phy
        return last >= 0 and self.store.dispatched_offset <= last < self.store.log.max_offset

    def _log_agrees(self, mark: LogMark) -> bool:
        """Whether the log still holds the record the state at ``mark`` ends with."""
        if mark.last_phy < 0:
            return self.store.min_offset(self.topic, self.queue_id) <= mark.next_offset
        got = self._read(mark.next_offset - 1, 1)
        if not got:
            return False
        m = got[0]
        return m.phy_offset == mark.last_phy and zlib.crc32(m.body) == mark.last_crc

    def _apply_all(self, max_records: int | None = None) -> int:
        applied = 0
        while max_records is None or applied < max_records:
            want = CATCH_UP_CHUNK if max_records is None else min(CATCH_UP_CHUNK, max_records)
            got = self._read(self.mark.next_offset, want)
            if not got:
                break
            for m in got:
                self._apply_body(m.body, m.phy_offset)
                self.applied(m.queue_offset, m.phy_offset, m.body)
            applied += len(got)
        return applied

    def _read(self, offset: int, count: int) -> list[StoredMessage]:
        try:
            return self.store.get_messages(
                self.topic, self.queue_id, offset, count, _READ_BYTES
            ).messages
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            return []
