"""The receive snapshot file's frame: the state's own encoding behind a header naming the log
record the state ends with; anything damaged is refused (SnapshotFileError), never half-used."""

from __future__ import annotations

import struct
import zlib

import pytest

from tidemq.services.broker.receive.events import Init, QueueKey, Received
from tidemq.services.broker.receive.snapshot_files import (
    LogMark,
    SnapshotFileError,
    decode,
    encode,
)
from tidemq.services.broker.receive.states import ReceiveStates

KEY = QueueKey("workers", "jobs", 3)


def some_state() -> ReceiveStates:
    states = ReceiveStates()
    states.apply(Init(KEY, 10), 100)
    states.apply(Received(KEY, 1_000, 31_000, ((10, 1, 0), (11, 1, 7)), (12,), (), 13), 200)
    return states


def test_a_snapshot_decodes_to_the_state_and_the_record_it_ends_with() -> None:
    mark = LogMark(2, 200, 0xDEADBEEF)
    got_mark, got = decode(encode(mark, some_state()))
    assert got_mark == mark
    assert got == some_state()


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda d: d[:10], "shorter than"),
        (lambda d: b"XXXX" + d[4:], "magic"),
        (lambda d: d[:4] + b"\x02" + d[5:], "header CRC"),  # the CRC covers the version
        (lambda d: d[:6] + bytes([d[6] ^ 1]) + d[7:], "header CRC"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]), "CRC"),  # the state's own CRC
    ],
)
def test_a_damaged_snapshot_is_refused(damage: object, why: str) -> None:
    data = encode(LogMark(2, 200, 1), some_state())
    with pytest.raises(SnapshotFileError, match=why):
        decode(damage(data))  # type: ignore[operator]


def test_a_header_and_a_body_of_different_positions_are_refused() -> None:
    states = some_state()
    body = states.encode_snapshot(5)
    header = struct.pack(">4sBqqI", b"TRSS", 1, 2, 200, 1)
    data = header + struct.pack(">I", zlib.crc32(header)) + body
    with pytest.raises(SnapshotFileError, match="position"):
        decode(data)
