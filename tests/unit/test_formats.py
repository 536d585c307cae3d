"""Golden bytes of the small formats: ConsumeQueue entry, checkpoint."""

import struct
from pathlib import Path

import pytest

from tidemq.storage.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from tidemq.storage.consume_queue import BLANK_ENTRY, ENTRY

pytestmark = pytest.mark.unit


def test_consume_queue_entry_is_20_bytes_offset_size_tag() -> None:
    assert ENTRY.size == 20
    assert ENTRY.pack(0x0102030405060708, 1147, -5) == (
        bytes.fromhex("0102030405060708") + struct.pack(">i", 1147) + struct.pack(">q", -5)
    )
    assert bytes(8) + bytes.fromhex("7FFFFFFF") + bytes(8) == BLANK_ENTRY


def test_checkpoint_layout_and_round_trip(tmp_path: Path) -> None:
    cp = Checkpoint(1, 2, 3, 4, 5, 6)
    raw = cp.encode()
    assert raw[:48] == struct.pack(">qqqqqq", 1, 2, 3, 4, 5, 6)
    write_checkpoint(str(tmp_path), cp)
    assert (tmp_path / "checkpoint").stat().st_size == 4096
    assert read_checkpoint(str(tmp_path)) == cp


def test_checkpoint_min_timestamp_is_min_minus_3s() -> None:
    assert Checkpoint(10_000, 8_000).min_timestamp_ms() == 5_000
    assert Checkpoint(1_000, 8_000).min_timestamp_ms() == 0


def test_damaged_checkpoint_reads_as_missing(tmp_path: Path) -> None:
    write_checkpoint(str(tmp_path), Checkpoint(1, 2, 3, 4, 5, 6))
    with open(tmp_path / "checkpoint", "r+b") as f:
        f.seek(41)
        f.write(b"\xff")
    assert read_checkpoint(str(tmp_path)) is None
    assert read_checkpoint(str(tmp_path / "nowhere")) is None
