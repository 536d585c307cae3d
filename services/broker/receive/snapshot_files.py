"""Snapshot files of the receive state: ``<store>/receive/snapshot-<position>.bin``.

A snapshot is the whole ``ReceiveStates`` as of a position in the receive log, so a restart
replays only what came after it, and retention may delete the log before it. The file is the
states' own encoding (versioned, CRC32 over its body) behind a small header naming the log
record the state ends with (its CommitLog offset and body CRC): a snapshot is used only while
the log still holds that very record, so one taken before the log was truncated (a slave cut
back to its new master's history, an unflushed tail lost to a power cut) is never used.

Files are written atomically (temp file, fsync, rename, directory fsync); the newest
``KEEP`` are kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import zlib

from tidemq.services.broker.event_log import LogMark
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.storage.atomic_file import write_atomic

log = logging.getLogger(__name__)

__all__ = ["KEEP", "LogMark", "SnapshotFileError", "SnapshotFiles", "decode", "encode"]

KEEP = 3
_NAME = re.compile(r"^snapshot-(\d{20})\.bin\Z")
_MAGIC = b"TRSS"
_VERSION = 1
# magic, version, next log queue offset, last record's CommitLog offset and body CRC, header CRC
_HEADER = struct.Struct(">4sBqqI")
_HEADER_CRC = struct.Struct(">I")


class SnapshotFileError(ValueError):
    """A snapshot file that cannot be used (damaged, or of an unknown version)."""


def encode(mark: LogMark, states: ReceiveStates) -> bytes:
    header = _HEADER.pack(_MAGIC, _VERSION, mark.next_offset, mark.last_phy, mark.last_crc)
    return header + _HEADER_CRC.pack(zlib.crc32(header)) + states.encode_snapshot(mark.next_offset)


def decode(data: bytes) -> tuple[LogMark, ReceiveStates]:
    head = _HEADER.size + _HEADER_CRC.size
    if len(data) < head:
        raise SnapshotFileError(f"{len(data)} bytes, shorter than the {head}-byte header")
    magic, version, next_offset, last_phy, last_crc = _HEADER.unpack_from(data)
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if magic != _MAGIC:
        raise SnapshotFileError(f"not a receive snapshot (magic {magic!r})")
    if crc != zlib.crc32(data[: _HEADER.size]):
        raise SnapshotFileError("header CRC mismatch")
    if version != _VERSION:
        raise SnapshotFileError(f"unknown snapshot version {version}")
    try:
        position, states = ReceiveStates.decode_snapshot(data[head:])
    except ValueError as e:  # SnapshotFormatError
        raise SnapshotFileError(str(e)) from None
    if position != next_offset:
        raise SnapshotFileError(f"body at position {position}, header at {next_offset}")
    return LogMark(next_offset, last_phy, last_crc), states


class SnapshotFiles:
    """The snapshot directory of one broker."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def positions(self) -> list[int]:
        """Positions of the snapshots on disk, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _NAME.match(n)))

    def path(self, position: int) -> str:
        return os.path.join(self.directory, f"snapshot-{position:020d}.bin")

    def read(self, position: int) -> tuple[LogMark, ReceiveStates]:
        try:
            with open(self.path(position), "rb") as f:
                return decode(f.read())
        except OSError as e:
            raise SnapshotFileError(f"cannot read it: {e.strerror}") from None

    def write(self, position: int, data: bytes) -> None:
        """Atomically, then drop all but the newest ``KEEP`` (blocking: run in an executor)."""
        os.makedirs(self.directory, exist_ok=True)
        write_atomic(self.path(position), data, keep_backup=False)
        for old in self.positions()[:-KEEP]:
            self.remove(old)

    def remove(self, position: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(position))

    def oldest(self) -> int | None:
        kept = self.positions()
        return kept[0] if kept else None
