"""An append-only journal beside a state snapshot, so that a change to a large table (topics,
subscription groups) costs one short fsync'd append instead of a rewrite of the whole file.

File format: one record per line, ``<crc> <json>\\n``, where ``<json>`` is the record as compact
JSON with sorted keys and ``<crc>`` is the CRC-32 of the JSON's UTF-8 bytes as 8 lowercase hex
digits. Every record carries ``"seq"``, one more than the record before it (across
compactions: the snapshot says up to which ``seq`` it holds, so records it already holds are
skipped when a crash fell between a compaction's snapshot and its truncation of the journal).
What else a record holds is its table's business. Example (a topic created)::

    5e1c2a0b {"del":[],"put":[{"topic":"orders",...}],"seq":7,"v":{"counter":7,...}}

Reading: a last line that is incomplete or fails its CRC is what a crash in the middle of an
append leaves (the change was never acknowledged): ``Journal.open`` cuts it off and keeps its
bytes aside as ``<journal>.torn-<UTC time>``. A bad line followed by good ones is damage, not a
crash: a ``StateFileError`` naming the line and the fix.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.clock import now_ms
from tidemq.storage.state_file import StateFileError

log = logging.getLogger(__name__)


def encode(record: dict[str, Any]) -> bytes:
    """One journal line: the record's compact JSON behind its CRC-32."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode(line: bytes) -> dict[str, Any]:
    """The record of a complete line (without its newline); ValueError when it is damaged."""
    crc, sep, body = line.partition(b" ")
    if not sep or len(crc) != 8:
        raise ValueError("no CRC before the record")
    try:
        expected = int(crc, 16)
    except ValueError:
        raise ValueError("no CRC before the record") from None
    if zlib.crc32(body) != expected:
        raise ValueError("CRC mismatch")
    try:
        record = json.loads(body)
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
        raise ValueError("not a journal record (no seq)")  # noqa: TRY004 (damage, not a bug)
    return record


@dataclass(frozen=True)
class Replay:
    records: list[dict[str, Any]]  # the good records, in order
    good_bytes: int  # where the good records end
    torn: bytes  # a damaged last line (a crash mid-append), b"" when none


def read(path: str, fix: str) -> Replay:
    """The journal's records (an absent journal has none); StateFileError when a line other
    than the last is damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Replay([], 0, b"")
    records: list[dict[str, Any]] = []
    pos = 0
    for number, (start, end) in enumerate(_lines(data), 1):
        complete = end < len(data)  # the line has its newline
        try:
            if not complete:
                raise ValueError("incomplete line")
            record = _decode(data[start:end])
            if records and record["seq"] != records[-1]["seq"] + 1:
                raise ValueError(f"seq {record['seq']} after {records[-1]['seq']}")
        except ValueError as e:
            if end + 1 >= len(data):  # the last line: a torn append
                return Replay(records, pos, data[start:])
            raise StateFileError(path, f"line {number}: {e}", fix) from None
        records.append(record)
        pos = end + 1
    return Replay(records, pos, b"")


def _lines(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each line; end is the newline's index, or len(data) for a last line
    without one."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield start, end
        start = end + 1


def keep_torn(path: str, torn: bytes) -> str:
    """Write a torn tail's bytes beside the journal for a post-mortem; returns the name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms() / 1000))
    target = f"{path}.torn-{stamp}"
    n = 1
    while os.path.exists(target):
        n += 1
        target = f"{path}.torn-{stamp}-{n}"
    with open(target, "wb") as f:
        f.write(torn)
        f.flush()
        os.fsync(f.fileno())
    return target


class Journal:
    """The writer's side. ``open`` replays the journal (cutting a torn tail), ``append`` makes
    one record durable before it returns, ``truncate`` empties the journal once a snapshot
    holds everything in it."""

    def __init__(self, path: str, replay: Replay) -> None:
        self.path = path
        self.entries = len(replay.records)
        self.bytes_written = 0  # appended since open; what the scale tests measure
        self._fd = -1
        if replay.torn:
            aside = keep_torn(path, replay.torn)
            log.warning(
                "%s: cut an incomplete last record (%d bytes, a crash during an append that was "
                "never acknowledged); its bytes are kept as %s",
                path,
                len(replay.torn),
                aside,
            )
            with open(path, "r+b") as f:
                f.truncate(replay.good_bytes)
                os.fsync(f.fileno())

    @classmethod
    def open(cls, path: str, fix: str) -> tuple[Journal, list[dict[str, Any]]]:
        replay = read(path, fix)
        return cls(path, replay), replay.records

    def _file(self) -> int:
        if self._fd < 0:
            existed = os.path.exists(self.path)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if not existed:
                # The new name must survive a crash as well as the records written under it.
                fsync_dir(os.path.dirname(self.path))
        return self._fd

    def append(self, record: dict[str, Any]) -> None:
        fd = self._file()
        view = memoryview(encode(record))
        size = len(view)
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)
        self.entries += 1
        self.bytes_written += size

    def truncate(self) -> None:
        fd = self._file()
        os.ftruncate(fd, 0)
        os.fdatasync(fd)
        self.entries = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
