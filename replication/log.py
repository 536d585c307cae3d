"""What replication knows of a CommitLog: its range, the CRC of any range it holds, and the probes
a slave sends so its master can tell whether the two logs still agree.

Probe format (``LogProbe`` in protos/replication.proto): (offset, length, crc32) where crc32 is
``zlib.crc32`` of the raw CommitLog bytes [offset, offset + length). A slave sends, newest first:

1. the tail: from the start of its last whole record to its end (a blank marker or a record
   half-received from a chunk included), so "everything I hold is yours" is one comparison;
2. its last whole record alone;
3. the first record of each CommitLog file, newest file first (at most ``MAX_FILE_PROBES``).

Every probe but the tail starts and ends on a record boundary of the slave's log, so when the
master finds one it holds byte for byte, that end is a record boundary of both logs: a safe place
to cut the slave back to. Records carry their own physical offset and store timestamp, so equal
bytes at the same offset are the same record, not a coincidence. After such a cut the slave
fetches again at most one file of bytes it already had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tidemq.storage.log_reader import CommitLogReader
from tidemq.storage.record import OK, RecordInfo

MAX_FILE_PROBES = 64


@dataclass(frozen=True, slots=True)
class Probe:
    offset: int
    length: int
    crc32: int


class LogView(Protocol):
    """A CommitLog as the master's handshake sees it."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def crc_of(self, offset: int, length: int) -> int | None:
        """CRC-32 of [offset, offset + length), or None when the log does not hold all of it."""
        ...


def slave_probes(commitlog: CommitLogReader, max_file_probes: int = MAX_FILE_PROBES) -> list[Probe]:
    """The probes a slave sends in its handshake (see the module docstring), newest first."""
    end = commitlog.max_offset
    bases = commitlog.file_base_offsets()
    if not bases or end <= commitlog.min_offset:
        return []
    seen: set[tuple[int, int]] = set()
    probes: list[Probe] = []

    def add(offset: int, length: int) -> None:
        crc = commitlog.crc_of(offset, length)
        if crc is not None and (offset, length) not in seen:
            seen.add((offset, length))
            probes.append(Probe(offset, length, crc))

    last = _last_record(commitlog, bases, end)
    if last is not None:
        add(last[0], end - last[0])
        add(*last)
    for base in reversed(bases[-max_file_probes:]):
        first = _first_record(commitlog, base, end)
        if first is not None:
            add(*first)
    return probes


def _records(commitlog: CommitLogReader, start: int, end: int) -> list[tuple[int, int]]:
    """(offset, size) of the whole records in [start, end), CRCs unchecked: probes are compared
    with the master's bytes, which is a stronger check than the CRC."""
    out = []
    for at, status, info in commitlog.iter_records(start, end, verify_from=end):
        if status != OK:
            break
        assert isinstance(info, RecordInfo)
        out.append((at, info.size))
    return out


def _last_record(commitlog: CommitLogReader, bases: list[int], end: int) -> tuple[int, int] | None:
    """The last whole record below ``end``: looked for in the last file, then the one before (the
    last may hold only the start of a record)."""
    for base in reversed(bases[-2:]):
        if base >= end:
            continue
        records = _records(commitlog, base, min(base + commitlog.file_size, end))
        if records:
            return records[-1]
    return None


def _first_record(commitlog: CommitLogReader, base: int, end: int) -> tuple[int, int] | None:
    for at, status, info in commitlog.iter_records(base, end, verify_from=end):
        if status == OK and isinstance(info, RecordInfo):
            return at, info.size
        return None
    return None
