"""Builds and follows the idempotence table from the CommitLog: every run stamped with
PRODUCER_SEQ (``stamp``) is ``record``ed, on masters and slaves alike, so a restarted or
promoted broker answers retries of what its log holds. A run's head is stamped and its other
records follow it unstamped; each is recorded when the scan reaches it, so a run the log holds
only part of (torn by a crash, or still arriving at a slave) counts for what is there.

The master records its own puts as it makes them (``sends``) and moves the scan past them when
nothing else was appended in between (``skip_own``); the scan reads the rest: replicated bytes
on a slave, the system records other services append. A log cut back under the scanned
position (a demoted master's divergent tail) makes the table start again from the log's first
record. Runs on the event loop, a chunk per step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import NamedTuple

from tidemq.services.broker.idempotence.snapshot import (
    SnapshotFormatError,
    decode_snapshot,
    encode_snapshot,
)
from tidemq.services.broker.idempotence.stamp import (
    PRODUCER_SEQ_PROPERTY,
    RUN_MEMBER_SYSFLAG,
    StampFormatError,
    decode_stamp,
)
from tidemq.services.broker.idempotence.table import IdempotenceTable
from tidemq.storage import MessageStore
from tidemq.storage.atomic_file import read_with_fallback, write_atomic
from tidemq.storage.errors import OffsetBelowMinError
from tidemq.storage.record import OK, RecordInfo
from tidemq.storage.record.properties import find_property

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 4 << 20  # per loop step: a long tail does not hold up other calls
FOLLOW_INTERVAL_S = 0.1
SNAPSHOT_INTERVAL_S = 10.0
# A delayed or half message keeps its own topic and queue in these properties.
_REAL_TOPIC = b"REAL_TOPIC"
_REAL_QID = b"REAL_QID"
_STAMP = PRODUCER_SEQ_PROPERTY.encode()
# What ``CommitLogReader.scan_runs`` answers (``storage.record.runs``): a stamped head, a run of
# flagged members, other records.
_HEAD, _MEMBERS = 0, 1


class Mark(NamedTuple):
    """The last record scanned: the log still agrees with the table while it holds it."""

    phy_offset: int
    size: int
    queue_offset: int
    topic: str


@dataclass(slots=True)
class OpenRun:
    """A stamped run whose records the scan has not all seen yet: each next record of the run
    is unstamped, flagged RUN_MEMBER_SYSFLAG, in the head's queue, at the next queue offset."""

    producer_id: int
    epoch: int
    key: tuple[str, int]
    next_seq: int
    stored: tuple[str, int]
    next_queue_offset: int
    left: int


class LogScan:
    def __init__(
        self, store: MessageStore, table: IdempotenceTable, snapshot_path: str | None = None
    ) -> None:
        self.store = store
        self.table = table
        self.snapshot_path = snapshot_path
        self._saved_position = -1
        self.position = -1  # -1: not scanned yet; the first scan starts at the log's start
        self.mark: Mark | None = None
        # A run cut by the end of what was scanned: a tail still arriving, or torn for good.
        self.run: OpenRun | None = None
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
            self.run = None  # a run is written whole: one that stopped before a put is torn

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
            self.run = None
        if self.position < log_.min_offset:  # retention went past a scan that lagged
            self.position = log_.min_offset
            self.mark = None
            self.run = None
        end = log_.max_offset
        start = self.position
        if max_bytes is not None and start + max_bytes < end:
            scanned = self._scan(start, start + max_bytes)
            if scanned:
                return scanned
            # The next record is longer than max_bytes: scan it whole.
        return self._scan(start, end)

    def _scan(self, start: int, end: int) -> int:
        """Scan [start, end): the compiled walk finds the stamped heads and the runs of flagged
        records after them (``CommitLogReader.scan_runs``), so no Python code runs per record:
        per head, per run of members and per stretch of other records."""
        log_ = self.store.log
        try:
            found = log_.scan_runs(start, end, _STAMP, RUN_MEMBER_SYSFLAG)
        except OffsetBelowMinError:
            self.position = -1  # retention raced the scan: start again
            self.run = None
            return 0
        for item in found.items:
            kind = item[0]
            if kind == _HEAD:
                self._head(*item[1:])
            elif kind == _MEMBERS:
                if self.run is not None:
                    self._members(*item[1:])
            elif self.run is not None:  # another record where the run's next was due
                self._torn(item[1])
        self.records_scanned += found.scanned
        self.position = found.end
        if found.last is not None:
            self.mark = Mark(*found.last)
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

    def _head(
        self, phy: int, size: int, topic: str, queue_id: int, queue_offset: int, props: bytes
    ) -> None:
        """A stamped record: a run's head (the run open before it, if any, was torn)."""
        self.run = None
        text = find_property(props, _STAMP)
        if text is None:
            return
        try:
            stamp = decode_stamp(text.decode())
            key = (topic, queue_id)
            if topic.startswith("%SYS%"):
                real_topic = find_property(props, _REAL_TOPIC)
                real_qid = find_property(props, _REAL_QID)
                if real_topic is not None and real_qid is not None:
                    key = (real_topic.decode(), int(real_qid))
        except (StampFormatError, ValueError) as e:
            log.error("record at %d: %s", phy, e)  # noqa: TRY400 - the reason is the message
            return
        stored = (topic, queue_id)
        pid, epoch, seq = stamp.producer_id, stamp.epoch, stamp.sequence
        # Only the records the log holds count: a torn run's missing tail was never stored.
        self.table.record(pid, epoch, key, seq, 1, stored, queue_offset)
        if stamp.run_length > 1:
            self.run = OpenRun(
                pid, epoch, key, seq + 1, stored, queue_offset + 1, stamp.run_length - 1
            )

    def _members(
        self, topic: str, queue_id: int, first_queue_offset: int, count: int, phy: int, size: int
    ) -> None:
        """``count`` flagged records of one queue after the open run's last one seen: the run's
        next ones, when they are its queue's next offsets (recorded in one go)."""
        run = self.run
        assert run is not None
        if (topic, queue_id) != run.stored or first_queue_offset != run.next_queue_offset:
            self._torn(phy)
            return
        n = min(count, run.left)
        self.table.record(
            run.producer_id, run.epoch, run.key, run.next_seq, n, run.stored, first_queue_offset
        )
        run.left -= n
        if run.left:
            run.next_seq += n
            run.next_queue_offset += n
        else:
            self.run = None  # flagged records past the run's end belong to no run

    def _torn(self, phy: int) -> None:
        run = self.run
        assert run is not None
        log.warning(
            "run of producer %#x ends %d records short at %d (a torn put)",
            run.producer_id,
            run.left,
            phy,
        )
        self.run = None

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
        """Scan what is appended for as long as the broker runs; save the table every
        SNAPSHOT_INTERVAL_S when it moved."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.load_snapshot)
        await self.rebuild()
        saved_at = time.monotonic()
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            try:
                await self.catch_up_fully()
                if time.monotonic() - saved_at >= SNAPSHOT_INTERVAL_S:
                    data = self.snapshot_bytes()
                    if data is not None:
                        await loop.run_in_executor(None, self.write_snapshot, *data)
                    saved_at = time.monotonic()
            except Exception:  # logged; the next round tries again
                log.exception("following the CommitLog for idempotence failed")

    # ------------------------------------------------------------------ snapshots
    def load_snapshot(self) -> bool:
        """At start, before the first scan: the saved table, if the log still agrees with it."""
        if self.snapshot_path is None:
            return False
        data = read_with_fallback(self.snapshot_path)
        if data is None:
            return False
        try:
            position, mark = decode_snapshot(data, self.table)
        except SnapshotFormatError as e:
            log.warning("idempotence snapshot ignored (%s): scanning the whole log", e)
            return False
        self.position, self.mark = position, Mark(*mark)
        if not self._agrees():
            log.warning("the log no longer holds the idempotence snapshot's last record")
            self.table.clear()
            self.position, self.mark = -1, None
            return False
        self._saved_position = position
        return True

    def snapshot_bytes(self) -> tuple[str, bytes] | None:
        """The table encoded now (on the loop), when it holds exactly the records below the
        position (caught up: nothing the master recorded lies past it) and moved since the
        last save."""
        if (
            self.snapshot_path is None
            or not self.caught_up
            or self.mark is None
            or self.run is not None  # its rest is not in the log yet: not a state to keep
            or self.position == self._saved_position
        ):
            return None
        m = self.mark
        self._saved_position = self.position
        return self.snapshot_path, encode_snapshot(
            self.position, (m.phy_offset, m.size, m.queue_offset, m.topic), self.table
        )

    @staticmethod
    def write_snapshot(path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data)
