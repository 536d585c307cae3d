"""The transaction logs as the broker follows them: the half records of ``%SYS%TRANS_HALF`` and
the events of ``%SYS%TRANS_OP``, applied in order into ``OpenTransactions``.

The master appends op records (``append``, with the committed message in the same put, before
it) and applies them in the same step of the event loop; halves and everything on slaves are
applied as dispatch publishes them (``catch_up``, woken by a dispatch listener). A log cut back
under the state (a slave's diverged tail truncated, a tail lost before its flush) rebuilds it
from the logs' first retained records: the state is small, and retention keeps every open half
(``retention_position``) and so every op record after it.

A commit is one put of [committed message, Resolved]; a crash can keep the message and lose the
record. ``repair`` finds such halves through the index (the copy's UNIQ_KEY and
TRAN_HALF_OFFSET) so that a new master never commits them a second time."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Sequence

from tidemq.services.broker.transactions.events import (
    HALF_TOPIC,
    OP_QUEUE,
    OP_TOPIC,
    Event,
    EventFormatError,
    decode_event,
    encode_event,
)
from tidemq.services.broker.transactions.halves import (
    PGROUP,
    commit_key,
    is_committed_copy,
    real_topic,
)
from tidemq.services.broker.transactions.state import OpenHalf, OpenTransactions
from tidemq.storage import Message, MessageStore, PutResult, StoredMessage
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

log = logging.getLogger(__name__)

CHUNK = 512
_READ_BYTES = 8 << 20


class LogBehindError(Exception):
    """An append found op records this broker has not applied before its own."""


class TransactionLog:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.state = OpenTransactions()
        self.half_next = 0  # next queue offset of the half queue to apply
        self.op_next = 0
        # The last record applied of each log: (CommitLog offset, body CRC); -1: none.
        self._half_last = (-1, 0)
        self._op_last = (-1, 0)
        self.rebuilds = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._behind = asyncio.Event()

    # ------------------------------------------------------------------ start-up
    def open(self) -> None:
        """Blocking, before serving: the state from the logs as stored."""
        self.store.wait_dispatched(self.store.log.max_offset, 60)
        self._rebuild("start-up")

    def _rebuild(self, why: str) -> None:
        self.state = OpenTransactions()
        self.half_next = self.store.min_offset(HALF_TOPIC, 0)
        self.op_next = self.store.min_offset(OP_TOPIC, OP_QUEUE)
        self._half_last = self._op_last = (-1, 0)
        self._apply_all()
        log.info(
            "transactions rebuilt (%s): %d open, half log at %d, op log at %d",
            why,
            len(self.state),
            self.half_next,
            self.op_next,
        )

    # ------------------------------------------------------------------ the master
    def append(self, event: Event, before: Sequence[Message] = ()) -> PutResult:
        """Put ``before`` (the committed message) and the event's record in one put, and apply
        the event."""
        body = encode_event(event)
        record = Message(topic=OP_TOPIC, queue_id=OP_QUEUE, body=body)
        put = self.store.put_messages([*before, record])
        r = put.results[-1]
        if r.queue_offset != self.op_next:
            self._behind.set()
            raise LogBehindError(f"op record at {r.queue_offset}, state at {self.op_next}")
        self.state.apply(event)
        self.op_next = r.queue_offset + 1
        self._op_last = (r.phy_offset, zlib.crc32(body))
        return put

    async def catch_up_fully(self) -> None:
        """Before a promoted master decides anything: every record of its log, applied."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.store.wait_dispatched, self.store.log.max_offset, 30)
        await self._catch_up_in_steps(verify=True)

    async def _catch_up_in_steps(self, *, verify: bool) -> None:
        # A chunk per step of the loop: a long backlog does not hold up other calls.
        applied = self.catch_up(CHUNK, verify=verify)
        while applied:
            await asyncio.sleep(0)
            applied = self.catch_up(CHUNK)

    def repair(self) -> list[OpenHalf]:
        """Open halves whose committed copy is stored already (a torn commit): the master
        records them resolved."""
        found = []
        for h in list(self.state.open.values()):
            half = self.half(h.offset)
            if half is not None and self.committed_copy(half) is not None:
                found.append(h)
        return found

    def committed_copy(self, half: StoredMessage) -> StoredMessage | None:
        topic, _ = real_topic(half)
        for m in self.store.query_by_key(topic, commit_key(half), max_num=64):
            if is_committed_copy(m, half.phy_offset):
                return m
        return None

    def half(self, offset: int) -> StoredMessage | None:
        try:
            m = self.store.look_message(offset)
        except Exception:  # noqa: BLE001 - no record there (deleted, out of range, not a start)
            return None
        return m if m.topic == HALF_TOPIC else None

    # ------------------------------------------------------------------ following
    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.store.add_dispatch_listener(self._dispatched)

    def _dispatched(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        if topic in (HALF_TOPIC, OP_TOPIC) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._behind.set)

    async def follow(self) -> None:
        while True:
            await self._behind.wait()
            self._behind.clear()
            try:
                await self._catch_up_in_steps(verify=True)
            except Exception:  # logged; the next dispatch tries again
                log.exception("following the transaction logs failed")

    def catch_up(self, max_records: int | None = None, *, verify: bool = False) -> int:
        """Apply dispatched records after the applied positions. With ``verify`` (following
        replicated records, promotion), a log cut back under the state first rebuilds it: it
        ends before the applied position, or the last record applied is gone or different (a
        slave's diverged tail replaced by its new master's history). A master appending its
        own records skips that look."""
        store = self.store
        # The master's own last op record, applied as appended, not yet dispatched.
        ahead = self._op_last[0] >= store.dispatched_offset
        if verify and not (
            self._agrees(HALF_TOPIC, 0, self.half_next, self._half_last)
            and (ahead or self._agrees(OP_TOPIC, OP_QUEUE, self.op_next, self._op_last))
        ):
            self.rebuilds += 1
            self._rebuild("the log was cut back")
            return 0
        return self._apply_all(max_records, ops=not ahead)

    def _agrees(self, topic: str, qid: int, next_offset: int, last: tuple[int, int]) -> bool:
        if self.store.max_offset(topic, qid) < next_offset:
            return False
        if last[0] < 0:
            return True
        got = self._read(topic, qid, next_offset - 1, 1)
        return bool(got) and (got[0].phy_offset, zlib.crc32(got[0].body)) == last

    def _apply_all(self, max_records: int | None = None, *, ops: bool = True) -> int:
        applied = 0
        limit = CHUNK if max_records is None else max_records
        while True:
            got = self._read(HALF_TOPIC, 0, self.half_next, limit)
            for m in got:
                self._apply_half(m)
            applied += len(got)
            if len(got) < limit or max_records is not None:
                break
        while ops:
            got = self._read(OP_TOPIC, OP_QUEUE, self.op_next, limit)
            for m in got:
                self._apply_op(m)
            applied += len(got)
            if len(got) < limit or max_records is not None:
                break
        return applied

    def _apply_half(self, m: StoredMessage) -> None:
        p = m.properties
        try:
            topic, qid = real_topic(m)
            half = OpenHalf(
                m.phy_offset,
                m.queue_offset,
                p.get(PGROUP, ""),
                topic,
                qid,
                p.get("UNIQ_KEY") or m.msg_id,
                m.store_timestamp_ms,
            )
        except (KeyError, ValueError) as e:
            log.error("half record at %d skipped: %s", m.phy_offset, e)  # noqa: TRY400
        else:
            self.state.add_half(half, m.phy_offset + m.size)
        self.half_next = m.queue_offset + 1
        self._half_last = (m.phy_offset, zlib.crc32(m.body))

    def _apply_op(self, m: StoredMessage) -> None:
        try:
            event = decode_event(m.body)
        except EventFormatError as e:
            log.error("transaction op record at %d skipped: %s", m.phy_offset, e)  # noqa: TRY400
        else:
            self.state.apply(event)
        self.op_next = m.queue_offset + 1
        self._op_last = (m.phy_offset, zlib.crc32(m.body))

    def _read(self, topic: str, qid: int, offset: int, count: int) -> list[StoredMessage]:
        try:
            return self.store.get_messages(topic, qid, offset, count, _READ_BYTES).messages
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            return []

    # ------------------------------------------------------------------ retention
    def retention_position(self) -> tuple[str, int, int] | None:
        """The oldest open half, which retention must keep (with every record after it).
        Called from the store's housekeeping thread."""
        try:
            oldest = self.state.oldest()
        except RuntimeError:  # the loop changed the dict under us: pin the whole log this pass
            return HALF_TOPIC, 0, self.store.min_offset(HALF_TOPIC, 0)
        return (HALF_TOPIC, 0, oldest.queue_offset) if oldest is not None else None
