"""The replication stream's chunks encoded and parsed by hand (tidemq.protos.wire): the same
bytes protobuf reads and writes, the data copied once on the way out and not at all on the way
in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.protos import replication_pb2 as R
from tidemq.protos.wire import FrameError, chunk_frame, parse_chunk_frame, varint

OFFSETS = st.integers(min_value=0, max_value=(1 << 63) - 1)


def test_a_chunk_frame_has_its_golden_bytes() -> None:
    frame = chunk_frame(300, b"ab", 2, 7, 1)
    assert frame.hex() == "120d" + "08ac02" + "1802" + "2007" + "2801" + "12026162"


@given(offset=OFFSETS, data=st.binary(max_size=300), epoch=OFFSETS, start=OFFSETS, confirm=OFFSETS)
def test_protobuf_reads_a_frame_as_the_chunk_it_holds_and_the_parser_reads_protobufs_chunks(
    offset: int, data: bytes, epoch: int, start: int, confirm: int
) -> None:
    chunk = R.Chunk(
        offset=offset, data=data, epoch=epoch, epoch_start_offset=start, confirm_offset=confirm
    )
    assert R.MasterMessage.FromString(chunk_frame(offset, data, epoch, start, confirm)) == (
        R.MasterMessage(chunk=chunk)
    )
    parsed = parse_chunk_frame(R.MasterMessage(chunk=chunk).SerializeToString())
    assert parsed is not None
    assert (parsed[0], bytes(parsed[1]), *parsed[2:]) == (offset, data, epoch, start, confirm)


def test_other_messages_are_left_to_protobuf() -> None:
    heartbeat = R.MasterMessage(heartbeat=R.Heartbeat(master_max_offset=5))
    assert parse_chunk_frame(heartbeat.SerializeToString()) is None
    assert parse_chunk_frame(b"") is None


def test_negative_numbers_read_as_protobuf_writes_them() -> None:
    raw = R.MasterMessage(chunk=R.Chunk(offset=-5, confirm_offset=-1)).SerializeToString()
    parsed = parse_chunk_frame(raw)
    assert parsed is not None
    assert (parsed[0], parsed[4]) == (-5, -1)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x12\x04\x08\xac\x02\x12",  # a varint cut short inside the chunk
        b"\x12\x04\x12\x05ab",  # data claiming more than there is
        b"\x12\x02\x0b\x00",  # a wire type a chunk never has
    ],
)
def test_malformed_frames_are_refused(raw: bytes) -> None:
    with pytest.raises(FrameError):
        parse_chunk_frame(raw)


def test_varint_refuses_negative_numbers() -> None:
    assert varint(300) == b"\xac\x02"
    with pytest.raises(ValueError, match="negative"):
        varint(-1)
