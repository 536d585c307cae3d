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
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from storage.errors import (
    BodyTooLargeError,
    CorruptRecordError,
    OffsetBelowMinError,
    RawAppendOffsetError,
)
from storage.mapped_file import MappedFile, offset_to_name
from storage.mapped_file_queue import MappedFileQueue
from storage.record import (
    BLANK_SIZE,
    CORRUPT,
    END_OF_FILE,
    INCOMPLETE,
    OK,
    PREFIX,
    SYSFLAG_BORNHOST_V6,
    EncodedMessage,
    RecordInfo,
    StoredMessage,
    check_record,
    make_msg_id,
    read_record,
    write_blank,
    write_record,
)

_I64 = struct.Struct(">q")


class AppendResult(NamedTuple):
    """Where one appended message went. A NamedTuple: one is built per message under the put
    lock, and a frozen dataclass costs four times as much to construct."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp_ms: int
    store_host: tuple[bytes, int]

    @property
    def msg_id(self) -> str:
        """The offset message id; built on demand, outside the append lock."""
        return make_msg_id(self.store_host, self.phy_offset)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        # (topic, queue id) -> queue offset the next message gets.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp_ms = 0
        # Records below this offset were written here or already CRC-checked; above it (replicated
        # bytes) the dispatcher verifies every CRC before anything becomes readable.
        self.trusted_end = 0
        self.last_write_raw = False

    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    # ----------------------------------------------------------------- append
    def max_record_size(self) -> int:
        return self.file_size - BLANK_SIZE

    def put(self, batch: Sequence[EncodedMessage]) -> list[AppendResult]:
        """Append a batch. The caller holds the store's put lock."""
        last = self.mfq.last_file
        total = sum(m.size for m in batch)
        if last is not None and last.wrote + total + BLANK_SIZE <= last.size:
            return self._put_in_place(last, batch)
        return self._put_across_files(batch)

    def _put_in_place(self, f: MappedFile, batch: Sequence[EncodedMessage]) -> list[AppendResult]:
        """The common case: the whole batch fits the current file, so no blank, no roll."""
        now = max(_now_ms(), self.last_store_timestamp_ms)
        table = self.topic_queue_table
        host = self.store_host
        mm = f.mm
        base = f.base_offset
        pos = f.wrote
        start = base + pos
        results: list[AppendResult] = []
        with memoryview(mm) as view:
            for m in batch:
                key = (m.topic, m.queue_id)
                qoff = table.get(key, 0)
                write_record(view, pos, m, qoff, base + pos, now)
                table[key] = qoff + 1
                results.append(AppendResult(base + pos, m.size, qoff, now, host))
                pos += m.size
        f.wrote = pos
        self.last_store_timestamp_ms = now
        if self.trusted_end == start:
            self.trusted_end = base + pos
        self.last_write_raw = False
        return results

    def _put_across_files(self, batch: Sequence[EncodedMessage]) -> list[AppendResult]:
        fs = self.file_size
        limit = self.max_record_size()
        start = self.mfq.max_offset
        if not self.mfq.files:
            start = self.trusted_end - self.trusted_end % fs
        # Plan every placement first: blank markers, rolls and queue offsets.
        plan: list[tuple[int, EncodedMessage | None, int]] = []  # (offset, msg|None=blank, qoff)
        overlay: dict[tuple[str, int], int] = {}
        table = self.topic_queue_table
        off = start
        for m in batch:
            if m.size > limit:
                raise BodyTooLargeError(
                    f"record of {m.size} bytes cannot fit a CommitLog file of {fs} bytes"
                )
            room = fs - off % fs
            if m.size + BLANK_SIZE > room:
                plan.append((off, None, room))
                off += room
            key = (m.topic, m.queue_id)
            qoff = overlay.get(key)
            if qoff is None:
                qoff = table.get(key, 0)
            overlay[key] = qoff + 1
            plan.append((off, m, qoff))
            off += m.size
        self._ensure_files(start, off)
        now = max(_now_ms(), self.last_store_timestamp_ms)
        results: list[AppendResult] = []
        files = self.mfq
        f: MappedFile | None = None
        host = self.store_host
        for at, placed, qoff in plan:
            if f is None or not (f.base_offset <= at < f.end_offset):
                f = files.find_file(at)
                assert f is not None
            pos = at - f.base_offset
            if placed is None:
                write_blank(f.mm, pos, qoff)
                f.wrote = f.size
                continue
            with memoryview(f.mm) as view:
                write_record(view, pos, placed, qoff, at, now)
            f.wrote = pos + placed.size
            results.append(AppendResult(at, placed.size, qoff, now, host))
        table.update(overlay)
        self.last_store_timestamp_ms = now
        if self.trusted_end == start:
            self.trusted_end = off
        self.last_write_raw = False
        return results

    def _ensure_files(self, start: int, end: int) -> None:
        created: list[MappedFile] = []
        try:
            f = self.mfq.last_file
            if f is None:
                created.append(self.mfq.file_for_append(start))
                f = created[-1]
            while f.end_offset < end:
                created.append(self._new_file(f.end_offset))
                f = created[-1]
        except BaseException:
            for c in created:
                c.destroy()
            self.mfq.files = [x for x in self.mfq.files if x not in created]
            raise

    def _new_file(self, base: int) -> MappedFile:
        os.makedirs(self.mfq.directory, exist_ok=True)
        f = MappedFile.create(
            os.path.join(self.mfq.directory, offset_to_name(base)), self.file_size, base
        )
        self.mfq.files = [*self.mfq.files, f]
        return f

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
            f.mm[f.wrote : f.wrote + n] = view[:n]
            f.wrote += n
            off += n
            view = view[n:]
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
            limit = min(f.wrote, end - f.base_offset)
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
                    if f.wrote < f.size:
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
        limit = min(f.wrote, readable_end - f.base_offset)
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
        return bytes(f.mm[pos : min(f.wrote, pos + max_bytes)])

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)

    def close(self) -> None:
        self.mfq.close()


__all__ = ["CORRUPT", "END_OF_FILE", "INCOMPLETE", "OK", "AppendResult", "CommitLog"]
