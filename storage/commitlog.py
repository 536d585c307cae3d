"""The CommitLog: one append-only log of records for every topic, on a MappedFileQueue.

Two ways in. ``put`` appends validated messages as records (the master's send path, batched).
``append_raw`` appends bytes that continue the log exactly (a replica copying its master); such a
range may begin or end inside a record, so only the dispatcher's scan decides what is whole.

A batch is all-or-nothing with respect to file allocation: every file the batch will need is
created before the first byte is written, so a full disk fails the batch cleanly.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence

from tidemq.storage.clock import now_ms
from tidemq.storage.errors import (
    CorruptRecordError,
    InvalidQueueIdError,
    OffsetBelowMinError,
    RawAppendOffsetError,
)
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.mapped_file_queue import MappedFileQueue
from tidemq.storage.queue_offsets import QueueOffsetTable
from tidemq.storage.record import (
    BLANK_SIZE,
    CORRUPT,
    END_OF_FILE,
    INCOMPLETE,
    OK,
    PREFIX,
    SYSFLAG_BORNHOST_V6,
    AppendResult,
    BlockPlacement,
    Message,
    RecordInfo,
    SentBlock,
    StoredMessage,
    check_record,
    encode_batch,
    read_record,
    topic_prefix,
)
from tidemq.storage.record.block import fill_block, filled_size_bound

_I64 = struct.Struct(">q")
_I32_MAX = (1 << 31) - 1
_SCRATCH_MIN_BYTES = 1 << 20


def write_records(f: MappedFile, pos: int, data: bytes | memoryview) -> None:
    """Write whole records at ``pos`` of ``f``: all but the first record's TOTALSIZE and
    MAGICCODE, then those 8 bytes. Until the last write the span starts with zeros (the end of
    the data), so a writer killed half-way never leaves a record that looks whole."""
    with memoryview(data) as view:
        f.write_at(pos + BLANK_SIZE, view[BLANK_SIZE:])
        f.write_at(pos, view[:BLANK_SIZE])


def _merge_spans(
    spans: list[tuple[int, int, int, bool]], more: list[tuple[int, int, int, bool]]
) -> None:
    """Append filled spans to ``spans``, one span where a block's records continue the last
    block's in the log and in the scratch buffer: a put of many small blocks is then one large
    write (``MappedFile.write_at`` takes pwrite past 64 KiB) rather than many small ones."""
    for at, o, n, fills in more:
        if spans and not fills:
            last_at, last_o, last_n, last_fills = spans[-1]
            if not last_fills and last_at + last_n == at and last_o + last_n == o:
                spans[-1] = (last_at, last_o, last_n + n, False)
                continue
        spans.append((at, o, n, fills))


class CommitLog:
    def __init__(
        self,
        root_dir: str,
        file_size: int,
        store_host: tuple[bytes, int],
        record_crc: bool = False,
    ) -> None:
        self.file_size = file_size
        self.record_crc = record_crc
        self.store_host = store_host
        self.mfq = MappedFileQueue(os.path.join(root_dir, "commitlog"), file_size)
        # (topic, queue id) -> queue offset the next message gets; a queue missing from it is
        # asked of ``queue_offset_source`` (``queue_offsets``).
        self.queue_offset_source: Callable[[tuple[str, int]], int] | None = None
        self.topic_queue_table: dict[tuple[str, int], int] = QueueOffsetTable()
        self.last_store_timestamp_ms = 0
        # Records below this offset were written here or already CRC-checked; above it (replicated
        # bytes) the dispatcher verifies every CRC before anything becomes readable.
        self.trusted_end = 0
        self.last_write_raw = False

    def reset_queue_table(self) -> None:
        """Forget every queue's next offset: each is asked of the source again when next used."""
        self.topic_queue_table = QueueOffsetTable(self.queue_offset_source)

    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    @property
    def max_offset(self) -> int:
        """The end of the log: where the next append goes."""
        return self.mfq.max_offset

    @property
    def committed_offset(self) -> int:
        """The end of what readers may see: ``max_offset``, except with a transient store pool,
        where bytes still only in a write buffer are past it."""
        return self.mfq.committed_offset

    # ----------------------------------------------------------------- append
    def put(self, msgs: Sequence[Message], max_body_bytes: int) -> list[AppendResult]:
        """Validate, encode and append a batch; the caller holds the store's put lock.

        Nothing is written unless every message is valid and every file the batch needs exists
        (so a full disk fails the batch cleanly)."""
        fs = self.file_size
        start = self.mfq.max_offset if self.mfq.files else self.trusted_end - self.trusted_end % fs
        now = max(now_ms(), self.last_store_timestamp_ms)
        batch = encode_batch(
            msgs,
            start,
            fs,
            self.topic_queue_table,
            now,
            self.store_host,
            max_body_bytes,
            self.record_crc,
        )
        if not batch.results:
            return []
        self._write(start, batch.end, batch.spans, batch.queue_offsets, now)
        return batch.results

    # put_blocks' stored records on their way to the files, kept for the next put.
    _scratch: bytearray | None = None

    def _scratch_for(self, size: int) -> bytearray:
        """The scratch buffer, with room for ``size`` bytes. A larger one replaces it rather
        than growing it in place: views of the old one may outlive a failed write."""
        scratch = self._scratch
        if scratch is None or len(scratch) < size:
            scratch = self._scratch = bytearray(max(size, _SCRATCH_MIN_BYTES))
        return scratch

    def put_blocks(
        self, blocks: Sequence[SentBlock], max_body_bytes: int
    ) -> tuple[list[BlockPlacement], int]:
        """Check and append sent blocks (``record.block``), in order, as one write; the caller
        holds the store's put lock. Nothing is written unless every block is valid and every
        file they need exists. Returns where each went and the records' store timestamp.

        ``fill_block`` lays each block out in the scratch buffer, and the files are written
        from there: each record is copied once between the request and the file."""
        fs = self.file_size
        start = self.mfq.max_offset if self.mfq.files else self.trusted_end - self.trusted_end % fs
        now = max(now_ms(), self.last_store_timestamp_ms)
        table = self.topic_queue_table
        store_v6 = len(self.store_host[0]) == 16
        need = 0
        for b in blocks:
            born_v6 = len(b.born_host[0]) == 16
            n, count, head = len(b.records), b.record_count, len(b.head_property)
            need += filled_size_bound(n, count, born_v6, store_v6, self.record_crc, head)
        out = self._scratch_for(need)
        out_pos = 0
        queue_offsets: dict[tuple[str, int], int] = {}
        filled_spans: list[tuple[int, int, int, bool]] = []
        placements: list[BlockPlacement] = []
        pos = start
        for b in blocks:
            topic_prefix(b.topic)  # a valid topic name, checked once per topic
            if not 0 <= b.queue_id <= _I32_MAX:
                raise InvalidQueueIdError(f"queue id {b.queue_id} out of range")
            key = (b.topic, b.queue_id)
            first = queue_offsets.get(key)
            if first is None:
                first = table.get(key, 0)
            filled = fill_block(
                b.records, b.record_count, b.topic, b.queue_id, pos, fs, first, now, b.born_host,
                self.store_host, max_body_bytes, self.record_crc, out, out_pos, b.head_property,
                b.member_sys_flag,
            )  # fmt: skip
            _merge_spans(filled_spans, filled.spans)
            _, last_at, last_len, _ = filled.spans[-1]
            out_pos = last_at + last_len
            queue_offsets[key] = first + b.record_count
            pos = filled.end
            placement = BlockPlacement(
                b.queue_id, b.record_count, first, filled.first_phy_offset, filled.added_bytes,
                filled.head_added_bytes, filled.file_starts, filled.last_phy_offset,
                filled.last_size, filled.body_bytes,
            )  # fmt: skip
            placements.append(placement)
        if placements:
            with memoryview(out) as view:
                spans = [(at, view[o : o + n], fills) for at, o, n, fills in filled_spans]
                self._write(start, pos, spans, queue_offsets, now)
        return placements, now

    def _write(
        self,
        start: int,
        end: int,
        spans: Sequence[tuple[int, bytes | memoryview, bool]],
        queue_offsets: dict[tuple[str, int], int],
        now: int,
    ) -> None:
        """Write encoded spans (records, or the place of a blank marker) from ``start`` to
        ``end``, creating every file they need first."""
        self._ensure_files(start, end)
        f = self.mfq.last_file
        for at, data, fills_file in spans:
            if f is None or not f.base_offset <= at < f.end_offset:
                f = self.mfq.find_file(at)
                assert f is not None
            pos = at - f.base_offset
            if fills_file:
                f.write_blank_end(pos)
            else:
                write_records(f, pos, data)
                f.wrote = pos + len(data)
        self.topic_queue_table.update(queue_offsets)
        self.last_store_timestamp_ms = now
        if self.trusted_end == start:
            self.trusted_end = end
        self.last_write_raw = False

    def _ensure_files(self, start: int, end: int) -> None:
        created: list[MappedFile] = []
        try:
            f = self.mfq.last_file
            if f is None:
                created.append(self.mfq.file_for_append(start))
                f = created[-1]
            while f.end_offset < end:
                created.append(self.mfq.create_file(f.end_offset))
                f = created[-1]
        except BaseException:
            for c in created:
                c.destroy()
            self.mfq.files = [x for x in self.mfq.files if x not in created]
            raise

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        """Append replicated bytes at exactly the end of the log; returns the new end."""
        end = self.mfq.max_offset if self.mfq.files else offset
        if offset != end or (not self.mfq.files and offset % self.file_size):
            raise RawAppendOffsetError(
                end if self.mfq.files else offset - offset % self.file_size, offset
            )
        if not self.mfq.files:
            self.trusted_end = offset
        view = memoryview(data)
        off = offset
        while view:
            f = self.mfq.file_for_append(off)
            n = min(len(view), f.remaining)
            f.write_at(f.wrote, view[:n])
            f.wrote += n
            off += n
            view = view[n:]
        # Replicated bytes are readable (and acknowledged to the master) as they arrive: with a
        # transient store pool they are committed at once; a batch from the network gains
        # nothing from waiting for the commit thread.
        self.mfq.commit(0)
        self.last_write_raw = True
        return off

    # ----------------------------------------------------------------- read
    def iter_records(
        self, start: int, end: int, verify_from: int
    ) -> Iterator[tuple[int, int, RecordInfo | str | None]]:
        """Walk records from ``start`` (a record boundary) up to ``end``.

        Yields (offset, status, info): OK with a RecordInfo; END_OF_FILE for a blank marker (the
        walk then continues in the next file, once this one is complete); INCOMPLETE or CORRUPT
        with a reason, after which the walk stops. CRCs are checked from ``verify_from`` on.
        """
        off = start
        while off < end:
            f = self.mfq.find_file(off)
            if f is None:
                return
            pos = off - f.base_offset
            limit = min(f.committed, end - f.base_offset)  # readers never see a write buffer
            mm = f.mm
            base = f.base_offset
            while pos < limit:
                at = base + pos
                status, info = check_record(mm, pos, limit, at >= verify_from, at, self.record_crc)
                if status == OK:
                    assert isinstance(info, RecordInfo)
                    yield at, status, info
                    pos += info.size
                elif status == END_OF_FILE:
                    if f.committed < f.size:
                        yield at, INCOMPLETE, "blank marker before the rest of its file arrived"
                        return
                    yield at, status, None
                    pos = f.size
                    break
                else:
                    yield at, status, info
                    return
            if pos < f.size:
                return
            off = f.end_offset

    def read(self, phy_offset: int, size: int | None, readable_end: int) -> StoredMessage:
        """The record at ``phy_offset``, CRC-checked; only whole records below ``readable_end``."""
        if phy_offset < self.mfq.min_offset:
            raise OffsetBelowMinError("CommitLog offset", phy_offset, self.mfq.min_offset)
        f = self.mfq.find_file(phy_offset)
        if f is None or phy_offset >= readable_end:
            raise CorruptRecordError(phy_offset, "no record at this offset")
        pos = phy_offset - f.base_offset
        limit = min(f.committed, readable_end - f.base_offset)
        try:
            msg = read_record(f.mm, pos, limit, phy_offset, self.record_crc)
        except ValueError as e:  # the file was deleted by retention while we read it
            raise OffsetBelowMinError("CommitLog offset", phy_offset, self.mfq.min_offset) from e
        if isinstance(msg, str) or (size is not None and msg.size != size):
            raise CorruptRecordError(phy_offset, msg if isinstance(msg, str) else "not a record")
        return msg

    def store_timestamp(self, phy_offset: int) -> int:
        f = self.mfq.find_file(phy_offset)
        if f is None:
            return 0
        pos = phy_offset - f.base_offset
        sys_flag = PREFIX.unpack_from(f.mm, pos)[7]
        at = pos + PREFIX.size + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
        ts: int = _I64.unpack_from(f.mm, at)[0]
        return ts

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Raw log bytes from ``offset``, never past the end of its file or of the data."""
        if offset < self.mfq.min_offset:
            raise OffsetBelowMinError("CommitLog offset", offset, self.mfq.min_offset)
        f = self.mfq.find_file(offset)
        if f is None:
            return b""
        pos = offset - f.base_offset
        return bytes(f.mm[pos : min(f.committed, pos + max_bytes)])

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)

    def close(self) -> None:
        self.mfq.close()


__all__ = ["CORRUPT", "END_OF_FILE", "INCOMPLETE", "OK", "AppendResult", "CommitLog"]
