"""The receive log: every change of receive state is one record of ``%SYS%RECEIVE_LOG`` (queue 0)
in the CommitLog, and the state is what applying those records in order gives (event sourcing).

The master appends (``append``) and applies the event at once with its lease id, the record's
CommitLog offset, in the same step of the event loop: nothing runs between the decision, the
append and the apply. Slaves receive the records as replicated bytes and apply them once
dispatched (``catch_up``, from a dispatch listener); a broker promoted to master catches up
before it decides anything (``ReceiveService``). So every broker of a group holds the same state
for the same log.

The log may be cut back under a broker: a slave's diverged tail truncated to its new master's
history, or a tail lost to a power cut before its flush. ``catch_up`` notices (the log ends
before the applied position, or the record the state ends with is gone or different) and
rebuilds: from the newest snapshot the log still agrees with, else by replaying the log from its
first retained record. Snapshots (``snapshot_files``) bound the replay at start-up; retention
keeps the log from the oldest kept snapshot on (``retention_position``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from collections.abc import Callable

from tidemq.services.broker.receive.events import (
    RECEIVE_LOG_TOPIC,
    Event,
    EventFormatError,
    decode_event,
    encode_event,
)
from tidemq.services.broker.receive.snapshot_files import (
    LogMark,
    SnapshotFileError,
    SnapshotFiles,
    encode,
)
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.storage import Message, MessageStore, PutResult, StoredMessage
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

log = logging.getLogger(__name__)

LOG_QUEUE = 0
# Records applied per step of a catch-up on the event loop, between yields to other calls.
CATCH_UP_CHUNK = 512
_READ_BYTES = 8 << 20


class JournalBehindError(Exception):
    """An append found records of the log this broker has not applied before its own."""


class ReceiveJournal:
    def __init__(self, store: MessageStore, store_dir: str) -> None:
        self.store = store
        self.snapshots = SnapshotFiles(os.path.join(store_dir, "receive"))
        self.states = ReceiveStates()
        self.mark = LogMark(0)
        # Applied since the last snapshot was taken.
        self.changed = False
        self.rebuilds = 0
        # Called with every event applied (on the event loop): long polls wake on them.
        self.on_applied: Callable[[Event], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._behind = asyncio.Event()

    # ------------------------------------------------------------------ start-up
    def open(self) -> None:
        """Load the newest usable snapshot and replay the log after it (blocking: the store is
        open, nothing serves yet)."""
        self.store.wait_dispatched(self.store.log.max_offset, 60)
        self._rebuild("start-up")

    def _rebuild(self, why: str) -> None:
        lo = self.store.min_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE)
        for position in reversed(self.snapshots.positions()):
            try:
                mark, states = self.snapshots.read(position)
            except SnapshotFileError as e:
                log.warning("receive snapshot %d unusable (%s); trying an older one", position, e)
                continue
            if self._log_agrees(mark):
                self.states, self.mark = states, mark
                break
            log.warning("receive snapshot %d is not in the log any more (cut back)", position)
            self.snapshots.remove(position)
        else:
            if lo > 0:
                log.warning(
                    "receive log: no usable snapshot and the log starts at %d; in-flight state "
                    "of the records before it is lost (their messages count as not received)",
                    lo,
                )
            self.states, self.mark = ReceiveStates(), LogMark(lo)
        self.changed = True
        self._apply_all()
        log.info(
            "receive state rebuilt (%s): %d queues, log position %d",
            why,
            len(self.states),
            self.mark.next_offset,
        )

    def _log_agrees(self, mark: LogMark) -> bool:
        """Whether the log still holds the record the state at ``mark`` ends with."""
        if mark.last_phy < 0:
            return self.store.min_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE) <= mark.next_offset
        got = self._read(mark.next_offset - 1, 1)
        if not got:
            return False
        m = got[0]
        return m.phy_offset == mark.last_phy and zlib.crc32(m.body) == mark.last_crc

    # ------------------------------------------------------------------ the master
    def append(self, event: Event) -> tuple[int, PutResult]:
        """Put the event's record and apply it; returns (lease id, the put to wait on)."""
        body = encode_event(event)
        put = self.store.put_messages(
            [Message(topic=RECEIVE_LOG_TOPIC, queue_id=LOG_QUEUE, body=body)]
        )
        r = put.results[0]
        if r.queue_offset != self.mark.next_offset:
            # Not applied here: the next catch-up applies it in its place.
            self._behind.set()
            raise JournalBehindError(
                f"receive log record at {r.queue_offset}, state at {self.mark.next_offset}"
            )
        self._apply(event, r.phy_offset)
        self.mark = LogMark(r.queue_offset + 1, r.phy_offset, zlib.crc32(body))
        return r.phy_offset, put

    def caught_up(self) -> bool:
        """Whether every record of the log (as dispatched) is applied."""
        return self.store.max_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE) <= self.mark.next_offset

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
        if topic == RECEIVE_LOG_TOPIC and max_offset > self.mark.next_offset and self._loop:
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
                log.exception("following the receive log failed")

    def catch_up(self, max_records: int | None = None) -> int:
        """Apply dispatched records after the applied position (at most ``max_records``);
        returns how many. A log cut back under the state rebuilds it first."""
        if self._ahead_of_dispatch():
            return 0
        if not self._log_agrees(self.mark) or (
            self.store.max_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE) < self.mark.next_offset
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

    def _apply_all(self, max_records: int | None = None) -> int:
        applied = 0
        while max_records is None or applied < max_records:
            want = CATCH_UP_CHUNK if max_records is None else min(CATCH_UP_CHUNK, max_records)
            got = self._read(self.mark.next_offset, want)
            if not got:
                break
            for m in got:
                self._apply_record(m)
            applied += len(got)
        return applied

    def _apply_record(self, m: StoredMessage) -> None:
        try:
            event = decode_event(m.body)
        except EventFormatError as e:
            # Written by a newer broker, or damaged: skipping it keeps the rest in order.
            log.error(  # noqa: TRY400 - the reason is the message; no traceback helps
                "receive log record at %d skipped: %s", m.phy_offset, e
            )
        else:
            self._apply(event, m.phy_offset)
        self.mark = LogMark(m.queue_offset + 1, m.phy_offset, zlib.crc32(m.body))

    def _apply(self, event: Event, lease_id: int) -> None:
        self.states.apply(event, lease_id)
        self.changed = True
        if self.on_applied is not None:
            self.on_applied(event)

    def _read(self, offset: int, count: int) -> list[StoredMessage]:
        try:
            return self.store.get_messages(
                RECEIVE_LOG_TOPIC, LOG_QUEUE, offset, count, _READ_BYTES
            ).messages
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            return []

    # ------------------------------------------------------------------ snapshots
    def snapshot_bytes(self) -> tuple[int, bytes] | None:
        """The state encoded now, on the event loop (None when nothing changed since the last);
        write it with ``write_snapshot`` off the loop."""
        if not self.changed:
            return None
        self.changed = False
        return self.mark.next_offset, encode(self.mark, self.states)

    def write_snapshot(self, position: int, data: bytes) -> None:
        self.snapshots.write(position, data)

    def retention_position(self) -> tuple[str, int, int]:
        """Where retention must keep the receive log from, as a consumer position: the record
        the oldest kept snapshot ends with (the whole log while there is none). Called from the
        store's housekeeping thread."""
        oldest = self.snapshots.oldest()
        return RECEIVE_LOG_TOPIC, LOG_QUEUE, max(0, oldest - 1) if oldest is not None else 0
