"""Dispatch (RocketMQ's "reput"): turn whole CommitLog records into ConsumeQueue entries and index
keys. The same code serves a master's own appends, a replica's copied bytes and recovery.

Idempotent: a ConsumeQueue skips entries it already holds (by physical offset and queue offset)
and the index skips messages it has indexed, so replaying a range writes the same bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidemq.storage.commitlog import CommitLog
from tidemq.storage.consume_queue import ENTRY, ENTRY_SIZE, GAP
from tidemq.storage.errors import CorruptRecordError, CorruptStoreError
from tidemq.storage.index_service import IndexService
from tidemq.storage.queue_store import ConsumeQueueStore
from tidemq.storage.record import CORRUPT, END_OF_FILE, INCOMPLETE, OK
from tidemq.storage.record.block import SpanScan, scan_span

log = logging.getLogger(__name__)

_INDEX_BATCH = 1024  # messages with keys whose index entries are written in one call
# Records per scan: enough to make the per-call cost vanish, few enough that a recovery pass over
# a whole file does not hold millions of gathered entries at once.
_SPAN_RECORDS = 4096
_EARLY_BLANK = "blank marker before the rest of its file arrived"
# Mapped in one call ahead of each span's scan (``MappedFile.map_in``): a span's records at most,
# for spans of small records.
_MAP_IN_BYTES = 8 << 20

DispatchListener = Callable[[str, int, int], None]
"""Called with (topic, queue id, new max queue offset) after new entries become readable."""


class DispatchGapError(CorruptStoreError):
    """A record's queue offset lies past the end of its ConsumeQueue: entries are missing."""

    def __init__(self, topic: str, queue_id: int, queue_offset: int, phy_offset: int) -> None:
        super().__init__(
            f"ConsumeQueue {topic}/{queue_id} lacks entries before queue offset {queue_offset} "
            f"(record at CommitLog offset {phy_offset})"
        )
        self.topic = topic
        self.queue_id = queue_id


class Dispatcher:
    """Advances ``offset`` over whole, valid records. Not thread-safe: one caller at a time."""

    def __init__(
        self, commitlog: CommitLog, queues: ConsumeQueueStore, index: IndexService | None
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.offset = commitlog.min_offset
        self.last_store_timestamp_ms = 0
        self.error: CorruptRecordError | None = None
        self.stopped_at: tuple[int, int, str] | None = None
        self.listeners: list[DispatchListener] = []
        # Where gathered keyed messages go; None: straight into ``index``. Recovery points it at
        # a helper process (storage.index_rebuild).
        self.index_sink: Callable[[list[tuple[str, int, int, list[bytes]]]], None] | None = None

    def dispatch(
        self,
        end: int,
        *,
        allow_prefill: bool = True,
        max_records: int | None = None,
        verify_from: int | None = None,
    ) -> int:
        """Dispatch whole records in [offset, end), at most ``max_records``; returns how many.

        Stops before an incomplete record (more bytes may come) and at a corrupt one, which is
        kept in ``error`` so the owner can refuse to go further; ``stopped_at`` says where and
        why it last stopped short of ``end``. CRCs are checked from ``verify_from`` (default:
        the CommitLog's trusted end).

        The records are walked a span at a time (``scan_span``, compiled): each span's
        ConsumeQueue entries are written one run per queue and its keys indexed in one batch.
        A span is applied whole before ``offset`` moves past it, and applying is idempotent, so
        a failure half-way is made good by dispatching the span again.
        """
        cl = self.commitlog
        touched: dict[tuple[str, int], int] = {}
        count = 0
        self.stopped_at = None
        verify = cl.trusted_end if verify_from is None else verify_from
        while self.offset < end and (max_records is None or count < max_records):
            f = cl.mfq.find_file(self.offset)
            if f is None:
                break
            base = f.base_offset
            left = _SPAN_RECORDS if max_records is None else min(_SPAN_RECORDS, max_records - count)
            pos = self.offset - base
            f.map_in(pos, min(f.committed, end - base, pos + _MAP_IN_BYTES) - pos)
            scan = scan_span(
                f.mm,
                self.offset - base,
                min(f.committed, end - base),  # never into bytes only in a write buffer
                base,
                verify,
                cl.record_crc,
                left,
            )
            self._apply(scan, allow_prefill, touched)
            count += scan.scanned
            at = base + scan.end
            self._advance(at)
            if scan.status == OK:
                if scan.scanned < left:
                    break  # reached ``end`` or the file's written part
            elif scan.status == END_OF_FILE:
                if f.committed < f.size:
                    self.stopped_at = (
                        at,
                        INCOMPLETE,
                        "blank marker before the rest of its file arrived",
                    )
                    break
                self._advance(f.end_offset)
            else:
                self.stopped_at = (at, scan.status, str(scan.reason))
                if scan.status == CORRUPT and (self.error is None or self.error.offset != at):
                    self.error = CorruptRecordError(at, str(scan.reason))
                    log.error("dispatch stopped before a corrupt record: %s", self.error)
                break
        for (topic, qid), max_q in touched.items():
            for listener in self.listeners:
                try:
                    listener(topic, qid, max_q)
                except Exception:  # a listener's bug must not stop dispatch for everyone
                    log.exception("dispatch listener %r failed", listener)
        return count

    def _advance(self, offset: int) -> None:
        self.offset = offset
        cl = self.commitlog
        cl.trusted_end = max(cl.trusted_end, offset)  # checked now, as far as dispatched

    def _index(self, keyed: list[tuple[str, int, int, list[bytes]]]) -> None:
        if keyed and self.index is not None:
            (self.index_sink or self.index.build_index_many)(keyed)

    def _apply(
        self, scan: SpanScan, allow_prefill: bool, touched: dict[tuple[str, int], int]
    ) -> None:
        table = self.commitlog.topic_queue_table
        for topic, qid, first, entries in scan.runs:
            cq = self.queues.get_or_create(topic, qid)
            if cq.put_run(first, entries, allow_prefill) == GAP:
                raise DispatchGapError(topic, qid, first, ENTRY.unpack_from(entries)[0])
            key = (topic, qid)
            nxt = first + len(entries) // ENTRY_SIZE
            touched[key] = nxt
            if table.get(key, 0) < nxt:
                table[key] = nxt
        keyed = scan.keyed
        for at in range(0, len(keyed), _INDEX_BATCH):
            self._index(keyed[at : at + _INDEX_BATCH])
        if scan.scanned:
            self.last_store_timestamp_ms = scan.last_store_timestamp_ms
