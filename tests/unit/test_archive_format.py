"""The archive's byte format (storage/archive/format.py), pinned by golden bytes: the queue slice,
a manifest entry, where chunks are cut; and the settings' validation. No files, no sockets."""

import hashlib
import json

import pytest

from tidemq.storage.archive.config import ArchiveConfig
from tidemq.storage.archive.format import (
    ArchiveCorruptError,
    ChunkFacts,
    Codec,
    ManifestEntry,
    QueueSpan,
    SegmentNotArchivableError,
    chunk_key,
    decode_queue_slice,
    encode_queue_slice,
    entry_key,
    queues_key,
    scan_segment,
)
from tidemq.storage.errors import ConfigError
from tidemq.storage.record import Message
from tidemq.storage.record.encode import encode_record, write_blank

pytestmark = pytest.mark.unit

HOST = (bytes([127, 0, 0, 1]), 10911)


def segment(sizes: list[int], file_size: int) -> tuple[bytes, list[int]]:
    """A CommitLog file at base 0 holding records of about these body sizes, alternating two
    queues of topic t, then a blank marker; returns it with each record's start."""
    buf = bytearray(file_size)
    pos = 0
    starts = []
    qoff = {0: 0, 1: 0}
    for i, n in enumerate(sizes):
        q = i % 2
        m = Message("t", bytes([65 + i % 26]) * n, queue_id=q, tags="a" if q else None)
        rec = encode_record(m, queue_offset=qoff[q], phy_offset=pos, store_host=HOST,
                            store_timestamp_ms=1_700_000_000_000 + i, record_crc=True)  # fmt: skip
        qoff[q] += 1
        starts.append(pos)
        buf[pos : pos + len(rec)] = rec
        pos += len(rec)
    write_blank(buf, pos, file_size - pos)
    return bytes(buf), starts


def test_object_keys() -> None:
    name = f"{1 << 30:020d}"
    assert chunk_key(name, 7) == "segments/00000000001073741824/chunk-000007"
    assert queues_key(name) == "segments/00000000001073741824/queues"
    assert entry_key(name) == "manifest/00000000001073741824.json"


def test_queue_slice_golden_bytes() -> None:
    spans = [QueueSpan("t", 0, 5, 1, 0), QueueSpan("t", 1, 9, 1, 1)]
    entries = bytes.fromhex(
        "0000000000000040"
        "00000100"
        "0000000000000000"  # phy 64, size 256, no tag
        "0000000000000140"
        "00000080"
        "0000000000000061"  # phy 320, size 128, tag code 97
    )
    stamps = bytes.fromhex("0000018bcfe568000000018bcfe56801")
    raw = encode_queue_slice(spans, entries, stamps)
    header = b'{"entries":2,"queues":[["t",0,5,1,0],["t",1,9,1,1]]}'
    assert raw == len(header).to_bytes(4, "big") + header + entries + stamps
    got = decode_queue_slice(raw)
    assert got.entry(got.spans["t", 1], 9) == (320, 128, 97, 1_700_000_000_001)
    assert got.packed(got.spans["t", 0], 5, 10) == entries[:20]


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1],  # a short timestamp section
        lambda raw: raw[:2],
        lambda raw: (9999).to_bytes(4, "big") + raw[4:],
        lambda raw: raw.replace(b'"entries":2', b'"entries":3'),
    ],
)
def test_a_damaged_queue_slice_is_refused(damage: object) -> None:
    raw = encode_queue_slice([QueueSpan("t", 0, 0, 2, 0)], b"\0" * 40, b"\0" * 16)
    with pytest.raises(ArchiveCorruptError):
        decode_queue_slice(damage(raw))  # type: ignore[operator]


def test_manifest_entry_golden_json_and_round_trip() -> None:
    e = ManifestEntry(
        name="00000000000000000000",
        base_offset=0,
        size_bytes=4096,
        archived=True,
        data_end_offset=300,
        sha256="ab" * 32,
        compression="zstd",
        chunk_bytes=2048,
        chunks=(ChunkFacts("c" * 32, 120, 2048), ChunkFacts("d" * 32, 20, 2048)),
        queues_md5="e" * 32,
        records=2,
        first_store_ms=1,
        last_store_ms=2,
        queues={"t": {0: (5, 2)}},
        archived_at_ms=3,
    )
    raw = e.to_json()
    assert json.loads(raw) == {
        "format_version": 1, "name": "00000000000000000000", "base_offset": 0,
        "size_bytes": 4096, "archived": True, "data_end_offset": 300, "sha256": "ab" * 32,
        "compression": "zstd", "chunk_bytes": 2048,
        "chunks": [["c" * 32, 120, 2048], ["d" * 32, 20, 2048]], "queues_md5": "e" * 32,
        "records": 2, "first_store_ms": 1, "last_store_ms": 2, "queues": {"t": {"0": [5, 2]}},
        "archived_at_ms": 3,
    }  # fmt: skip
    assert ManifestEntry.from_json(raw) == e
    assert e.chunk_starts == (0, 2048) and e.chunk_of(2047) == 0 and e.chunk_of(2048) == 1
    skipped = ManifestEntry("00000000000000004096", 4096, 4096, archived=False)
    assert ManifestEntry.from_json(skipped.to_json()) == skipped
    with pytest.raises(ArchiveCorruptError, match="format_version"):
        ManifestEntry.from_json(raw.replace(b'"format_version":1', b'"format_version":2'))
    with pytest.raises(ArchiveCorruptError, match="compression"):
        ManifestEntry.from_json(raw.replace(b'"zstd"', b'"lz4"'))


def test_chunks_are_cut_at_records_and_every_record_checked() -> None:
    data, starts = segment([900] * 9, 16384)
    scan = scan_segment(data, 0, True, 2048)
    assert scan.records == 9
    # Each cut is a record's start (or the data end, then every 2048 bytes of blank tail).
    record_cuts = [c for c in scan.cuts if c < scan.data_end]
    assert set(record_cuts) <= set(starts)
    assert all(b - a <= 2048 for a, b in zip(scan.cuts, scan.cuts[1:], strict=False))
    assert scan.data_end in scan.cuts and 16384 - scan.cuts[-1] <= 2048
    assert [(s.topic, s.queue_id, s.first_offset, s.count) for s in scan.spans] == [
        ("t", 0, 0, 5),
        ("t", 1, 0, 4),
    ]
    bad = bytearray(data)
    bad[starts[4] + 200] ^= 1  # a body byte: the CRCs catch it
    with pytest.raises(SegmentNotArchivableError, match=str(starts[4])):
        scan_segment(bytes(bad), 0, True, 2048)


def test_a_record_larger_than_a_chunk_has_a_chunk_of_its_own() -> None:
    data, starts = segment([100, 5000, 100], 8192)
    scan = scan_segment(data, 0, True, 1024)
    assert starts[1] in scan.cuts and starts[2] in scan.cuts


def test_codec_round_trip_and_damage() -> None:
    data = b"tidemq " * 1000
    z = Codec("zstd").compress(data)
    assert len(z) < len(data) // 10
    assert Codec.decompress("zstd", z, len(data), "k") == data
    assert Codec.decompress("none", data, len(data), "k") == data
    with pytest.raises(ArchiveCorruptError, match="does not decompress"):
        Codec.decompress("zstd", z[:-5] + b"xxxxx", len(data), "k")
    with pytest.raises(ArchiveCorruptError, match="holds"):
        Codec.decompress("none", data, len(data) + 1, "k")
    assert hashlib.md5(z, usedforsecurity=False).hexdigest()  # chunks are named by it


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"uri": ""}, "uri is empty"),
        ({"default_policy": "keep"}, "default_policy"),
        ({"compression": "lz4"}, "compression"),
        ({"chunk_bytes": 100}, "chunk_bytes"),
        ({"cache_bytes": 4096, "chunk_bytes": 8192}, "cache_bytes"),
        ({"interval_ms": 0}, "interval_ms"),
        ({"zstd_level": 30}, "zstd_level"),
    ],
)
def test_archive_settings_are_validated_once(kwargs: dict[str, object], problem: str) -> None:
    args: dict[str, object] = {"uri": "/mnt/archive", **kwargs}
    with pytest.raises(ConfigError, match=problem):
        ArchiveConfig(**args)  # type: ignore[arg-type]
