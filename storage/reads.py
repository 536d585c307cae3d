"""Reads: messages by queue offset, by CommitLog offset, by message id, by key and by time, and
the queue offsets a consumer may see. A reader sees a record only once dispatch has published it
(the dispatched offset), and every record it returns is checked (shape, position, CRCs).

``get_records`` is ``get_messages`` for a consumer that decodes records itself: the same
records, as their stored bytes back to back, gathered a file at a time by compiled code
(``record.gather``) instead of decoded one by one here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidemq.storage.archive.format import (
    ArchiveCorruptError,
    ArchiveOwnedError,
    ArchiveUnavailableError,
)
from tidemq.storage.consume_queue import ENTRY, ENTRY_SIZE, ConsumeQueue, is_blank
from tidemq.storage.errors import (
    CorruptRecordError,
    MessageNotFoundError,
    OffsetBelowMinError,
    OffsetBeyondMaxError,
)
from tidemq.storage.javahash import tag_code
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.parts import StoreParts
from tidemq.storage.record import StoredMessage, parse_msg_id
from tidemq.storage.record.block import gather_records
from tidemq.storage.record.decode import decode_record
from tidemq.storage.record.gather import ENTRIES_END, OTHER_FILE

QUERY_MAX_NUM = 64


@dataclass
class GetResult:
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass
class RecordsResult:
    """``get_records``' answer: ``count`` records as stored, back to back (``records``), and the
    offsets of ``GetResult``."""

    records: bytes
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


class QueueEntry(NamedTuple):
    """One ConsumeQueue entry: where its record is and its tag code (for a ``TIMER_TOPIC``
    record, its delivery time in ms)."""

    queue_offset: int
    phy_offset: int
    size: int
    tag_code: int


class StoreReader:
    """The read side of one store; holds no state of its own."""

    def __init__(self, parts: StoreParts) -> None:
        self._queues = parts.queues
        self._commitlog = parts.commitlog
        self._dispatcher = parts.dispatcher
        self._index = parts.index
        self._store_host = parts.config.store_host_packed
        self._archive = parts.archive

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset a consumer can read, archived ranges included."""
        cq = self._queues.get(topic, queue_id)
        return self._lowest(topic, queue_id, cq.min_offset) if cq is not None else 0

    def _lowest(self, topic: str, queue_id: int, local_min: int) -> int:
        if self._archive is None:
            return local_min
        got = self._archive.queue_range(topic, queue_id)
        return min(local_min, got[0]) if got is not None else local_min

    def _archived(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        local_min: int,
        max_count: int,
        max_bytes: int,
        tags: Sequence[str] | None,
    ) -> tuple[bytes, int, int]:
        """Records of one queue from ``offset``, below the local ConsumeQueue's minimum, read from
        the archive (within the one archived file that holds ``offset``): their stored bytes
        back to back, how many, and the next offset. Raises ``OffsetBelowMinError`` for an
        offset neither local nor archived, with the first offset that is."""
        if self._archive is not None and self._archive.refused:
            raise ArchiveOwnedError(self._archive.refused)
        if self._archive is not None and not self._archive.loaded:
            raise ArchiveUnavailableError(
                f"queue offset {offset} of {topic}/{queue_id} is below local retention and the "
                "archive's manifest has not been read yet"
            )
        lowest = self._lowest(topic, queue_id, local_min)
        codes = None if not tags or "*" in tags else {tag_code(t) for t in tags}
        tag_set = set(tags) if codes is not None and tags else None
        out = bytearray()
        got = None
        if self._archive is not None and offset >= lowest:
            got = self._archive.gather(
                topic, queue_id, offset, max_count, max_bytes, codes, tag_set, out
            )
        if got is None:
            # Below everything, or in a range no topic's policy archived: the next readable one.
            first = lowest if offset < lowest else local_min
            raise OffsetBelowMinError(f"queue offset of {topic}/{queue_id}", offset, first)
        consumed, records = got
        return bytes(out), records, offset + consumed

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queues.get(topic, queue_id)
        return self._visible_max(cq, self._dispatcher.offset) if cq is not None else 0

    @staticmethod
    def _visible_max(cq: ConsumeQueue, readable: int) -> int:
        """The queue's max offset, not counting an entry whose record dispatch has not published
        yet (dispatch writes the entry first; for one queue at most one is in flight)."""
        hi = cq.max_offset
        last = cq.get(hi - 1) if hi > cq.min_offset else None
        if last is not None and last[0] + last[1] > readable and not is_blank(last[0], last[1]):
            return hi - 1
        return hi

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tags: Sequence[str] | None = None,
        max_commitlog_offset: int | None = None,
    ) -> GetResult:
        """Messages of one queue from ``offset``: at most ``max_count``, and no more than
        ``max_bytes`` of records unless the first alone is larger. ``tags`` keeps only messages
        with one of those tags (None or ``*``: all). ``max_commitlog_offset`` hides records
        that end beyond it (a master's confirm offset): the read stops before them as it stops
        before records dispatch has not published, so the range checks are unaffected."""
        cq = self._queues.get(topic, queue_id)
        if cq is None:
            if offset > 0:
                raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, 0)
            return GetResult([], 0, 0, 0)
        readable = self._dispatcher.offset
        lo, hi = cq.min_offset, self._visible_max(cq, readable)
        if offset < lo:
            raw, n, nxt = self._archived(topic, queue_id, offset, lo, max_count, max_bytes, tags)
            msgs: list[StoredMessage] = []
            at = 0
            for _ in range(n):
                msgs.append(decode_record(raw, at))
                at += msgs[-1].size
            return GetResult(msgs, nxt, self._lowest(topic, queue_id, lo), hi)
        if offset > hi:
            raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, hi)
        wanted = None if not tags or "*" in tags else {tag_code(t) for t in tags}
        tag_set = set(tags) if wanted is not None and tags else None
        out: list[StoredMessage] = []
        total = 0
        q = offset
        scan_budget = max(max_count * 16, 256)  # bound the work a selective filter can cause
        visible = readable if max_commitlog_offset is None else min(readable, max_commitlog_offset)
        while q < hi and len(out) < max_count and scan_budget > 0:
            entries = cq.read(q, min(max_count * 4, scan_budget))
            if not entries:
                break
            for phy, size, code in entries:
                scan_budget -= 1
                if phy + size > visible:
                    # Dispatch wrote the entry but has not published its offset yet (or it is
                    # past the confirm offset).
                    return GetResult(out, q, lo, hi)
                if wanted is not None and code not in wanted:
                    q += 1
                    continue
                if out and total + size > max_bytes:
                    return GetResult(out, q, lo, hi)
                msg = self._commitlog.read(phy, size, readable)
                q += 1
                if tag_set is not None and msg.tags not in tag_set:
                    continue  # a tag-hash collision
                out.append(msg)
                total += size
                if len(out) >= max_count:
                    break
        return GetResult(out, q, lo, hi)

    def get_records(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        max_bytes: int = 256 * 1024,
        tags: Sequence[str] | None = None,
        max_commitlog_offset: int | None = None,
    ) -> RecordsResult:
        """``get_messages``' records as stored bytes: the same records, offsets and errors. The
        ConsumeQueue entries are read packed and handed to ``gather_records`` with the file
        their records are in; it checks and copies the records of that file, and comes back when
        one lies in another (found here, as ``CommitLog.read`` finds it) or the read is done."""
        cq = self._queues.get(topic, queue_id)
        if cq is None:
            if offset > 0:
                raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, 0)
            return RecordsResult(b"", 0, 0, 0, 0)
        readable = self._dispatcher.offset
        lo, hi = cq.min_offset, self._visible_max(cq, readable)
        if offset < lo:
            raw, n, nxt = self._archived(topic, queue_id, offset, lo, max_count, max_bytes, tags)
            return RecordsResult(raw, n, nxt, self._lowest(topic, queue_id, lo), hi)
        if offset > hi:
            raise OffsetBeyondMaxError(f"queue offset of {topic}/{queue_id}", offset, hi)
        codes = None if not tags or "*" in tags else {tag_code(t) for t in tags}
        tag_set = set(tags) if codes is not None and tags else None
        out = bytearray()
        count = 0
        q = offset
        scan_budget = max(max_count * 16, 256)  # as get_messages
        visible = readable if max_commitlog_offset is None else min(readable, max_commitlog_offset)
        crc = self._commitlog.record_crc
        f: MappedFile | None = None  # the file gathered from; the first record read picks it
        stop = ENTRIES_END
        while q < hi and count < max_count and scan_budget > 0 and stop == ENTRIES_END:
            raw = cq.read_raw(q, min(max_count * 4, scan_budget))
            if not raw:
                break
            with memoryview(raw) as entries:
                at = 0
                while True:
                    try:
                        got = gather_records(
                            f.mm if f is not None else b"",
                            f.base_offset if f is not None else 0,
                            f.committed if f is not None else 0,
                            readable, visible, entries[at:], codes, tag_set,
                            max_count - count, max_bytes, out, crc,
                        )  # fmt: skip
                    except ValueError as e:
                        if f is None or not f.closed:
                            raise
                        # Retention deleted the file meanwhile, as CommitLog.read answers it.
                        phy = ENTRY.unpack_from(entries, at)[0]
                        raise OffsetBelowMinError(
                            "CommitLog offset", phy, self._commitlog.min_offset
                        ) from e
                    at += got.consumed * ENTRY_SIZE
                    q += got.consumed
                    scan_budget -= got.consumed
                    count += got.records
                    stop = got.stop
                    if stop != OTHER_FILE:
                        break
                    f = self._file_of(ENTRY.unpack_from(entries, at)[0], readable, f)
                    stop = ENTRIES_END
        return RecordsResult(bytes(out), count, q, lo, hi)

    def _file_of(self, phy: int, readable: int, current: MappedFile | None) -> MappedFile:
        """The CommitLog file that holds the record at ``phy``, or the error ``CommitLog.read``
        raises for it."""
        cl = self._commitlog
        if phy < cl.min_offset:
            raise OffsetBelowMinError("CommitLog offset", phy, cl.min_offset)
        f = cl.mfq.find_file(phy)
        if f is None or phy >= readable:
            raise CorruptRecordError(phy, "no record at this offset")
        if f is current:  # gather found it outside the file that holds it: never a loop
            raise CorruptRecordError(phy, "no record at this offset")
        return f

    def queue_entries(
        self, topic: str, queue_id: int, offset: int, max_count: int
    ) -> list[QueueEntry]:
        """Up to ``max_count`` ConsumeQueue entries of one queue from ``offset`` (from the
        queue's minimum when retention went past it), published ones only, without reading a
        record: what a broker rebuilds its timer wheel from."""
        cq = self._queues.get(topic, queue_id)
        if cq is None:
            return []
        readable = self._dispatcher.offset
        q = max(offset, cq.min_offset)
        hi = self._visible_max(cq, readable)
        out: list[QueueEntry] = []
        while q < hi and len(out) < max_count:
            entries = cq.read(q, min(max_count - len(out), hi - q))
            if not entries:
                break
            for phy, size, code in entries:
                if not is_blank(phy, size):
                    out.append(QueueEntry(q, phy, size, code))
                q += 1
        return out

    def look_message(self, phy_offset: int) -> StoredMessage:
        if self._archive is not None and phy_offset < self._commitlog.min_offset:
            try:
                return self._archive.record(phy_offset)
            except ArchiveCorruptError as e:
                raise MessageNotFoundError(str(e)) from e
        if phy_offset >= self._dispatcher.offset:
            raise MessageNotFoundError(f"no whole record at CommitLog offset {phy_offset}")
        return self._commitlog.read(phy_offset, None, self._dispatcher.offset)

    def get_message_by_id(self, msg_id: str) -> StoredMessage:
        host, phy = parse_msg_id(msg_id)
        if host != self._store_host:
            raise MessageNotFoundError(f"message id {msg_id} belongs to another store host")
        try:
            return self.look_message(phy)
        except CorruptRecordError as e:
            raise MessageNotFoundError(f"message id {msg_id}: {e.reason}") from e

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
        max_num: int = 32,
        max_bytes: int | None = None,
    ) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (KEYS or UNIQ_KEY) stored within the range:
        at most ``max_num``, and no more than ``max_bytes`` of records (None: no byte bound)
        unless the first alone is larger."""
        if self._index is None:
            return []
        max_num = min(max_num, QUERY_MAX_NUM)
        out: list[StoredMessage] = []
        total = 0
        for phy in self._index.query(topic, key, max_num * 2, begin_ms, end_ms):
            try:
                msg = self.look_message(phy)
            except (OffsetBelowMinError, MessageNotFoundError, CorruptRecordError):
                continue
            if msg.topic == topic and (key in msg.keys or msg.properties.get("UNIQ_KEY") == key):
                total += msg.size
                if out and max_bytes is not None and total > max_bytes:
                    break
                out.append(msg)
                if len(out) >= max_num:
                    break
        return out

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``."""
        cq = self._queues.get(topic, queue_id)
        if cq is None:
            return 0
        if self._archive is not None and cq.min_offset < cq.max_offset:
            first = cq.get(cq.min_offset)
            if first is not None and self._commitlog.store_timestamp(first[0]) > timestamp_ms:
                # Older than everything local: the archive may hold it.
                got = self._archive.offset_by_time(topic, queue_id, timestamp_ms)
                if got is not None:
                    return got
        return cq.offset_by_time(
            timestamp_ms, lambda phy, _size: self._commitlog.store_timestamp(phy)
        )
