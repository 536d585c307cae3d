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
from tidemq.storage.record import END_OF_FILE, OK, RecordInfo
from tidemq.storage.record.properties import find_property

log = logging.getLogger(__name__)

SCAN_CHUNK_BYTES = 4 << 20  # per loop step: a long tail does not hold up other calls
FOLLOW_INTERVAL_S = 0.1
SNAPSHOT_INTERVAL_S = 10.0
# A delayed or half message keeps its own topic and queue in these properties.
_REAL_TOPIC = b"REAL_TOPIC"
_REAL_QID = b"REAL_QID"
_STAMP = PRODUCER_SEQ_PROPERTY.encode()
_STAMP_NAME = _STAMP + b"\x01"
_READ_BYTES = 1 << 20


def properties_of(buf: bytes, pos: int, size: int, topic: str) -> bytes | None:
    """The encoded properties of the record at ``pos``: a record ends with its topic, the
    properties' length (2 bytes) and the properties. Found from the end, where the topic is
    the last occurrence whose length field reaches exactly the record's end."""
    t = topic.encode()
    end = pos + size
    i = buf.rfind(t, pos, end)
    while i >= 0:
        j = i + len(t)
        if j + 2 <= end and int.from_bytes(buf[j : j + 2], "big") == end - j - 2:
            return buf[j + 2 : end]
        i = buf.rfind(t, pos, j - 1)
    return None


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
        log_ = self.store.log
        fs = log_.file_size
        buf = b""  # log bytes from buf_at: read a chunk at a time, not a record at a time
        buf_at = 0
        last: tuple[int, RecordInfo] | None = None
        try:
            for at, status, info in log_.iter_records(start, end, end):
                if status == OK:
                    assert isinstance(info, RecordInfo)
                    size = info.size
                    if at + size > buf_at + len(buf):
                        buf = log_.read_raw(at, max(_READ_BYTES, size))
                        buf_at = at
                    pos = at - buf_at
                    # Most records are not stamped: one C-speed search rules them out.
                    stamped = buf.find(_STAMP_NAME, pos, pos + size) >= 0 and self._scan_record(
                        buf, pos, info
                    )
                    if not stamped and self.run is not None:
                        self._continue_run(info)
                    self.records_scanned += 1
                    self.position = at + size
                    last = (at, info)
                elif status == END_OF_FILE:
                    # The next file starts where this one ends (files need not start at
                    # multiples of their size: a slave may restart its log at any offset).
                    base = max(b for b in log_.file_base_offsets() if b <= at)
                    self.position = base + fs
                else:
                    break  # a tail still arriving (or torn): scanned when it is whole
        except OffsetBelowMinError:
            self.position = -1  # retention raced the scan: start again
            self.run = None
            return 0
        if last is not None:
            at, info = last
            self.mark = Mark(at, info.size, info.queue_offset, info.topic)
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

    def _scan_record(self, buf: bytes, pos: int, info: RecordInfo) -> bool:
        """Records a run's head; False when the record is not stamped (the name was in its
        body, not a property)."""
        props = properties_of(buf, pos, info.size, info.topic)
        text = find_property(props, _STAMP) if props is not None else None
        if text is None:
            return False
        self.run = None  # a new run starts: the one open before it was torn
        try:
            stamp = decode_stamp(text.decode())
            key = (info.topic, info.queue_id)
            if info.topic.startswith("%SYS%") and props is not None:
                real_topic = find_property(props, _REAL_TOPIC)
                real_qid = find_property(props, _REAL_QID)
                if real_topic is not None and real_qid is not None:
                    key = (real_topic.decode(), int(real_qid))
        except (StampFormatError, ValueError) as e:
            log.error(  # noqa: TRY400 - the reason is the message
                "record at %d: %s", info.phy_offset, e
            )
            return True
        stored = (info.topic, info.queue_id)
        pid, epoch, seq = stamp.producer_id, stamp.epoch, stamp.sequence
        # Only the records the log holds count: a torn run's missing tail was never stored.
        self.table.record(pid, epoch, key, seq, 1, stored, info.queue_offset)
        if stamp.run_length > 1:
            self.run = OpenRun(
                pid, epoch, key, seq + 1, stored, info.queue_offset + 1, stamp.run_length - 1
            )
        return True

    def _continue_run(self, info: RecordInfo) -> None:
        run = self.run
        assert run is not None
        if (
            not info.sys_flag & RUN_MEMBER_SYSFLAG
            or (info.topic, info.queue_id) != run.stored
            or info.queue_offset != run.next_queue_offset
        ):
            log.warning(
                "run of producer %#x ends %d records short at %d (a torn put)",
                run.producer_id,
                run.left,
                info.phy_offset,
            )
            self.run = None
            return
        self.table.record(
            run.producer_id,
            run.epoch,
            run.key,
            run.next_seq,
            1,
            run.stored,
            info.queue_offset,
        )
        run.left -= 1
        if run.left:
            run.next_seq += 1
            run.next_queue_offset += 1
        else:
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
