"""Builds and follows the idempotence table from the CommitLog: every record stamped with
PRODUCER_SEQ (``stamp``) is ``record``ed, on masters and slaves alike, so a restarted or
promoted broker answers retries of what its log holds.

The master records its own puts as it makes them (``sends``) and moves the scan past them when
nothing else was appended in between (``skip_own``); the scan reads the rest: replicated bytes
on a slave, the system records other services append. A log cut back under the scanned
position (a demoted master's divergent tail) makes the table start again from the log's first
record. Runs on the event loop, a chunk per step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple

from tidemq.services.broker.idempotence.stamp import (
    PRODUCER_SEQ_PROPERTY,
    StampFormatError,
    decode_stamp,
)
from tidemq.services.broker.idempotence.table import IdempotenceTable
from tidemq.storage import MessageStore
from tidemq.storage.errors import OffsetBelowMinError
from tidemq.storage.record import END_OF_FILE, OK, RecordInfo, decode_record

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 4 << 20  # per loop step: a long tail does not hold up other calls
FOLLOW_INTERVAL_S = 0.1
REAL_TOPIC = "REAL_TOPIC"  # a delayed or half message keeps its own topic and queue in these
REAL_QID = "REAL_QID"


class Mark(NamedTuple):
    """The last record scanned: the log still agrees with the table while it holds it."""

    phy_offset: int
    size: int
    queue_offset: int
    topic: str


class LogScan:
    def __init__(self, store: MessageStore, table: IdempotenceTable) -> None:
        self.store = store
        self.table = table
        self.position = -1  # -1: not scanned yet; the first scan starts at the log's start
        self.mark: Mark | None = None
        self.rebuilds = 0
        self.records_scanned = 0

    @property
    def caught_up(self) -> bool:
        return self.position == self.store.log.max_offset

    def skip_own(self, start: int, end: int, last: Mark) -> None:
        """The master recorded [start, end) as it put it: nothing there to scan again."""
        if start == self.position:
            self.position = end
            self.mark = last

    def catch_up(self, max_bytes: int | None = None) -> int:
        """Scan from the position towards the log's end (at most ``max_bytes``); returns the
        bytes scanned."""
        log_ = self.store.log
        if self.position < 0 or not self._agrees():
            if self.position >= 0:
                self.rebuilds += 1
                log.warning(
                    "the log was cut back under the idempotence table (at %d): rebuilding",
                    self.position,
                )
            self.table.clear()
            self.position = log_.min_offset
            self.mark = None
        if self.position < log_.min_offset:  # retention went past a scan that lagged
            self.position = log_.min_offset
            self.mark = None
        end = log_.max_offset
        start = self.position
        if max_bytes is not None and start + max_bytes < end:
            scanned = self._scan(start, start + max_bytes)
            if scanned:
                return scanned
            # The next record is longer than max_bytes: scan it whole.
        return self._scan(start, end)

    def _scan(self, start: int, end: int) -> int:
        log_ = self.store.log
        fs = log_.file_size
        try:
            for at, status, info in log_.iter_records(start, end, end):
                if status == OK:
                    assert isinstance(info, RecordInfo)
                    self._scan_record(at, info)
                    self.position = at + info.size
                    self.mark = Mark(at, info.size, info.queue_offset, info.topic)
                elif status == END_OF_FILE:
                    self.position = (at // fs + 1) * fs
                else:
                    break  # a tail still arriving (or torn): scanned when it is whole
        except OffsetBelowMinError:
            self.position = -1  # retention raced the scan: start again
        return max(0, self.position - start)

    def _agrees(self) -> bool:
        log_ = self.store.log
        if self.position > log_.max_offset:
            return False
        m = self.mark
        if m is None:
            return True
        try:
            end = m.phy_offset + m.size
            for _at, status, info in log_.iter_records(m.phy_offset, end, end):
                return (
                    status == OK
                    and isinstance(info, RecordInfo)
                    and info.size == m.size
                    and info.queue_offset == m.queue_offset
                    and info.topic == m.topic
                )
        except OffsetBelowMinError:
            return True  # retention took it: what it said is in the table already
        return False

    def _scan_record(self, at: int, info: RecordInfo) -> None:
        self.records_scanned += 1
        raw = self.store.log.read_raw(at, info.size)
        if len(raw) < info.size:
            return
        props = decode_record(raw).properties
        text = props.get(PRODUCER_SEQ_PROPERTY)
        if text is None:
            return
        try:
            stamp = decode_stamp(text)
            key = (props.get(REAL_TOPIC, info.topic), int(props.get(REAL_QID, info.queue_id)))
        except (StampFormatError, ValueError) as e:
            log.error("record at %d: %s", at, e)  # noqa: TRY400 - the reason is the message
            return
        self.table.record(
            stamp.producer_id,
            stamp.epoch,
            key,
            stamp.sequence,
            1,
            (info.topic, info.queue_id),
            info.queue_offset,
        )

    async def catch_up_fully(self) -> None:
        scanned = self.catch_up(SCAN_CHUNK_BYTES)
        while scanned:
            await asyncio.sleep(0)  # the loop runs other calls between chunks
            scanned = self.catch_up(SCAN_CHUNK_BYTES)

    async def rebuild(self) -> None:
        """At start: the whole log, a chunk per step; logged with how long it took."""
        started = time.monotonic()
        before = self.position
        await self.catch_up_fully()
        log.info(
            "idempotence table built from the CommitLog [%d, %d): %d producers, %.2f s",
            max(before, 0),
            self.position,
            len(self.table),
            time.monotonic() - started,
        )

    async def follow(self) -> None:
        """Scan what is appended for as long as the broker runs."""
        await self.rebuild()
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            try:
                await self.catch_up_fully()
            except Exception:  # logged; the next round tries again
                log.exception("following the CommitLog for idempotence failed")
