"""File boundaries: blank markers, records that exactly fit, many rolls, raw appends."""

import os
import struct
from pathlib import Path

import pytest

from tests.store.conftest import StoreFactory, tiny_config
from tidemq.storage import Message, MessageStore
from tidemq.storage.errors import BodyTooLargeError, RawAppendOffsetError, TailNotAlignedError
from tidemq.storage.record import BLANK_MAGIC, encode_record

pytestmark = pytest.mark.store

FILE = 4096
OVERHEAD = 91 + 1 + 20  # topic "t", and the whole-record CRC property


def body_for(record_size: int) -> bytes:
    return b"b" * (record_size - OVERHEAD)


def test_record_leaving_exactly_8_bytes_fits_then_a_blank_ends_the_file(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    s = open_store()
    first = s.put_messages([Message("t", body_for(FILE - 8))]).results[0]
    assert first.phy_offset == 0 and first.size == FILE - 8
    second = s.put_messages([Message("t", b"x")]).results[0]
    assert second.phy_offset == FILE  # the 8 bytes left became the blank marker
    raw = (tmp_path / "store" / "commitlog" / f"{0:020d}").read_bytes()
    assert struct.unpack_from(">iI", raw, FILE - 8) == (8, BLANK_MAGIC)


def test_record_one_byte_too_big_for_the_rest_rolls(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    s = open_store()
    s.put_messages([Message("t", body_for(150))])
    r = s.put_messages([Message("t", body_for(FILE - 150 - 7))]).results[0]
    assert r.phy_offset == FILE
    raw = (tmp_path / "store" / "commitlog" / f"{0:020d}").read_bytes()
    assert struct.unpack_from(">iI", raw, 150) == (FILE - 150, BLANK_MAGIC)
    assert raw[158:] == bytes(FILE - 158)  # only the 8-byte marker is written


def test_record_larger_than_a_file_is_refused(open_store: StoreFactory) -> None:
    s = open_store()
    with pytest.raises(BodyTooLargeError):
        s.put_messages([Message("t", body_for(FILE - 7))])


def test_many_rolls_keep_every_message(open_store: StoreFactory, tmp_path: Path) -> None:
    s = open_store()
    bodies = [os.urandom(1 + (i * 37) % 900) for i in range(400)]
    for i in range(0, 400, 7):
        s.put_messages([Message("t", b, queue_id=0) for b in bodies[i : i + 7]])
    assert s.wait_dispatched(s.commitlog.max_offset, 10)
    files = sorted(os.listdir(tmp_path / "store" / "commitlog"))
    assert len(files) > 20
    assert [int(n) for n in files] == [i * FILE for i in range(len(files))]
    got, q = [], 0
    while q < 400:
        r = s.get_messages("t", 0, q, max_count=50)
        got += [m.body for m in r.messages]
        q = r.next_offset
    assert got == bodies


def test_raw_append_accepts_any_split_and_exposes_only_whole_records(tmp_path: Path) -> None:
    with MessageStore(tiny_config(tmp_path / "master")) as master:
        master.put_messages(
            [Message("t", os.urandom(300), queue_id=i % 2, keys=[f"k{i}"]) for i in range(40)]
        )
        end = master.commitlog.max_offset
        log = b"".join(master.read_raw(o, FILE) for o in range(0, end, FILE))
    with MessageStore(tiny_config(tmp_path / "slave")) as slave:
        with pytest.raises(RawAppendOffsetError):
            slave.append_raw(7, log[7:20])
        pos = 0
        for step in (3, 97, 500, 1, 4096, 2000, 13):  # splits land mid-header, mid-body, on files
            chunk = log[pos : pos + step]
            assert slave.append_raw(pos, chunk) == pos + len(chunk)
            pos += len(chunk)
            slave.dispatch_now()
            # Readable never runs past the last whole record received.
            assert slave.dispatcher.offset <= pos
        with pytest.raises(RawAppendOffsetError):
            slave.append_raw(pos + 1, b"x")
        with pytest.raises(TailNotAlignedError):
            slave.put_messages([Message("t", b"local")])  # the tail is mid-record
        slave.append_raw(pos, log[pos:])
        assert slave.wait_dispatched(end, 10)
        assert slave.max_offset("t", 0) == 20 and slave.max_offset("t", 1) == 20
        assert [m.queue_offset for m in slave.get_messages("t", 1, 0, 100).messages] == list(
            range(20)
        )
        assert slave.query_by_key("t", "k33")[0].phy_offset == master_offset_of(log, 33)
        # Now aligned: a local append continues the replica's log and its queue offsets.
        r = slave.put_messages([Message("t", b"local", queue_id=0)]).results[0]
        assert r.queue_offset == 20
        assert r.phy_offset in (end, end - end % FILE + FILE)  # here, or after a blank marker
    for name in ("master", "slave"):
        data = b"".join(
            (tmp_path / name / "commitlog" / n).read_bytes()
            for n in sorted(os.listdir(tmp_path / name / "commitlog"))
        )
        assert data[: len(log)] == log  # byte-identical prefix


def master_offset_of(log: bytes, n: int) -> int:
    """Physical offset of the n-th record of a raw log (walking sizes and blank markers)."""
    pos = seen = 0
    while True:
        size, magic = struct.unpack_from(">iI", log, pos)
        if magic == BLANK_MAGIC:
            pos += size
            continue
        if seen == n:
            return pos
        seen += 1
        pos += size


def test_corrupt_replicated_record_is_never_dispatched(tmp_path: Path) -> None:
    host = (bytes([127, 0, 0, 1]), 10911)
    good = encode_record(Message("t", b"good"), 0, 0, 1, host, record_crc=True)
    bad = bytearray(encode_record(Message("t", b"evil"), 1, len(good), 1, host, record_crc=True))
    bad[90] ^= 0xFF
    with MessageStore(tiny_config(tmp_path / "s")) as s:
        s.append_raw(0, good + bytes(bad))
        s.dispatch_now()
        assert s.dispatcher.offset == len(good)
        assert s.dispatcher.error is not None
        assert "CRC" in s.dispatcher.error.reason
        assert s.max_offset("t", 0) == 1
        # The replication layer truncates the bad tail; the bytes are kept as evidence.
        assert s.truncate_to(len(good), "diverged") == len(bad)
        assert s.commitlog.max_offset == len(good)
        assert len(os.listdir(tmp_path / "s" / "evidence")) == 2
