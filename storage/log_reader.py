"""A read-only view of a store's CommitLog for code outside the store: replication's handshake and
probes, failover, tools and benchmarks read the log through it and never through the CommitLog,
its files or its positions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from tidemq.storage.commitlog import CommitLog
from tidemq.storage.crc import crc32
from tidemq.storage.errors import OffsetBelowMinError
from tidemq.storage.record import END_OF_FILE, RecordInfo
from tidemq.storage.record.runs import Item, scan_runs

_CRC_READ_BYTES = 1 << 20


class RunsFound(NamedTuple):
    """What ``CommitLogReader.scan_runs`` found."""

    end: int  # where the walk stopped: the next record to scan
    scanned: int
    items: list[Item]
    last: tuple[int, int, int, str] | None  # the last record got past (``RunScan.last``)


class CommitLogReader:
    """Safe beside the appending thread, which only ever adds bytes past what this reads."""

    def __init__(self, commitlog: CommitLog) -> None:
        self._cl = commitlog

    @property
    def min_offset(self) -> int:
        """First byte still kept (retention moves it up)."""
        return self._cl.min_offset

    @property
    def max_offset(self) -> int:
        """End of the log: the offset the next byte gets."""
        return self._cl.max_offset

    @property
    def file_size(self) -> int:
        return self._cl.file_size

    def file_base_offsets(self) -> list[int]:
        """Where each CommitLog file starts, oldest first; empty for a log with no files."""
        return [f.base_offset for f in self._cl.mfq.files]

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Raw log bytes from ``offset``, never past the end of its file or of the data."""
        return self._cl.read_raw(offset, max_bytes)

    def iter_records(
        self, start: int, end: int, verify_from: int
    ) -> Iterator[tuple[int, int, RecordInfo | str | None]]:
        """The records from ``start`` (a record boundary) up to ``end``, as
        ``CommitLog.iter_records`` walks them; CRCs are checked from ``verify_from`` on."""
        return self._cl.iter_records(start, end, verify_from)

    def scan_runs(self, start: int, end: int, name: bytes, member_flag: int) -> RunsFound:
        """``record.runs.scan_runs`` over [start, end) (``start`` a record boundary), across
        files: the items of every span, where the walk stopped (before an incomplete or
        corrupt record, or at ``end``) and the last record it got past. Raises
        ``OffsetBelowMinError`` when retention deleted the file under the walk."""
        cl = self._cl
        items: list[Item] = []
        scanned = 0
        last = None
        off = start
        while off < end:
            f = cl.mfq.find_file(off)
            if f is None:
                break
            base = f.base_offset
            try:
                scan = scan_runs(
                    f.mm, off - base, min(f.committed, end - base), base, 0, name, member_flag
                )
            except ValueError as e:  # the file was closed by retention while we read it
                raise OffsetBelowMinError("CommitLog offset", off, cl.min_offset) from e
            items += scan.items
            scanned += scan.scanned
            last = scan.last or last
            off = base + scan.end
            if scan.status != END_OF_FILE or f.committed < f.size:
                break  # at ``end``, or before a record (or a file's rest) still arriving
            off = f.end_offset
        return RunsFound(off, scanned, items, last)

    def crc_of(self, offset: int, length: int) -> int | None:
        """CRC-32 of [offset, offset + length), or None when the log does not hold all of it
        (replication compares a slave's bytes with its master's by these)."""
        if length <= 0 or offset < self._cl.min_offset or offset + length > self._cl.max_offset:
            return None
        crc = 0
        end = offset + length
        try:
            while offset < end:
                data = self.read_raw(offset, min(_CRC_READ_BYTES, end - offset))
                if not data:
                    return None
                crc = crc32(data, crc)
                offset += len(data)
        except OffsetBelowMinError:  # retention deleted the file while we read it
            return None
        return crc
