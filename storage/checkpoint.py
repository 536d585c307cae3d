"""The checkpoint file ``{root}/checkpoint``: a 4 KiB page of int64 fields (spec §2.4).

    off  field                 meaning
      0  physicMsgTimestamp    store time of the last record flushed in the CommitLog
      8  logicsMsgTimestamp    store time of the last record whose ConsumeQueue entry was flushed
     16  indexMsgTimestamp     store time of the last record whose index entries were flushed
     24  masterFlushedOffset   (RocketMQ 5.x; kept for layout compatibility)
     32  confirmPhyOffset      highest offset confirmed by replication (0 until replication sets it)
     40  recoveryOffset        tidemq: every byte below it is flushed in the CommitLog AND
                               dispatched
                               and flushed in the ConsumeQueues and index
     48  crc                   tidemq: crc32 of bytes 0-47, masked; a mismatch means "no checkpoint"

RocketMQ's recovery picks a start file by comparing timestamps with these watermarks, minus 3 s of
margin. We record the offset itself (field 40), so abnormal recovery re-reads exactly the bytes
that may be missing from the ConsumeQueue or index, independent of any clock. The timestamps are
still maintained for tools that read them.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

from tidemq.storage.allocate import allocate
from tidemq.storage.atomic_file import fsync_dir

FILE_SIZE = 4096
_FIELDS = struct.Struct(">qqqqqq")
_CRC = struct.Struct(">I")


@dataclass
class Checkpoint:
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    recovery_offset: int = 0

    def min_timestamp_ms(self) -> int:
        """RocketMQ's getMinTimestamp: min(physic, logics) - 3 s, floored at 0."""
        return max(0, min(self.physic_msg_timestamp_ms, self.logics_msg_timestamp_ms) - 3000)

    def encode(self) -> bytes:
        body = _FIELDS.pack(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
            self.master_flushed_offset,
            self.confirm_phy_offset,
            self.recovery_offset,
        )
        return body + _CRC.pack(zlib.crc32(body) & 0x7FFFFFFF)

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint | None:
        need = _FIELDS.size + _CRC.size
        if len(data) < need:
            return None
        body = data[: _FIELDS.size]
        (crc,) = _CRC.unpack_from(data, _FIELDS.size)
        if zlib.crc32(body) & 0x7FFFFFFF != crc:
            return None
        return cls(*_FIELDS.unpack(body))


def checkpoint_path(root_dir: str) -> str:
    return os.path.join(root_dir, "checkpoint")


def read_checkpoint(root_dir: str) -> Checkpoint | None:
    """The stored checkpoint, or None when it is missing or fails its CRC."""
    try:
        with open(checkpoint_path(root_dir), "rb") as f:
            return Checkpoint.decode(f.read(FILE_SIZE))
    except FileNotFoundError:
        return None


def write_checkpoint(root_dir: str, cp: Checkpoint) -> None:
    """Overwrite the fields in place and fdatasync. 56 bytes inside one sector: a crash leaves the
    old or the new value, and the CRC catches anything else."""
    path = checkpoint_path(root_dir)
    created = not os.path.exists(path)
    if created:
        allocate(path, FILE_SIZE)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, cp.encode(), 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(root_dir)
