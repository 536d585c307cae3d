"""What an archive holds, byte for byte (docs/archive.md).

An archive is a key space (a directory, or a bucket and prefix) with, per archived CommitLog file
named ``N`` (its 20-digit base offset, as in ``commitlog/``):

- ``segments/N/chunk-000000`` ...: the file's bytes cut into chunks, each compressed on its own
  (a zstd frame, or stored as is). Concatenated and decompressed they are the CommitLog file
  exactly, so ``tidemq store check`` and the Spark jobs read an archived file as a local one.
  Chunks are cut at record boundaries, about ``chunk_bytes`` each (a record larger than that has
  a chunk of its own; the blank tail after the last record is cut at ``chunk_bytes``), so no
  record straddles two chunks. Chunks make uploads resumable (a chunk already there with the
  right MD5 is not sent again) and reads cheap (a record is served by decompressing the chunk
  it lies in, never the whole file);
- ``segments/N/queues``: the file's ConsumeQueue slice (below), compressed as the chunks are;
- ``owner.json``: the broker group whose CommitLog this is, written by its first master to
  archive; a broker of another group refuses the archive (same file names, other bytes);
- ``manifest/N.json``: the entry, written last. A file is archived exactly when its entry exists:
  a crash before that leaves chunks that the next attempt checks and reuses, never an entry for
  a file that is not all there, and never two entries for one file (the key is the name).

An entry whose ``archived`` is false records a file that no topic in it wanted archived (a
``delete`` retention policy): nothing was uploaded, and a slave may delete its copy.

The queue slice (``segments/N/queues``, before compression)::

    u32  header length H (big-endian)
    H    JSON: {"entries": N,
                "queues": [[topic, queue_id, first_queue_offset, count, first_entry], ...]}
    N*20 ConsumeQueue entries exactly as ``consumequeue/`` stores them (phy_offset i64, size i32,
         tag_code i64, big-endian), each queue's run in ``queues`` order
    N*8  each entry's record's store timestamp (ms, i64 big-endian), in the same order

A queue's records in one file have consecutive queue offsets, so the entry of queue offset ``q``
is ``first_entry + q - first_queue_offset``. Built from the records themselves when the file is
archived (their CRCs checked on the way), it is what the ConsumeQueue said about that range: the
local ConsumeQueue and index files of an archived range are deleted with it, and the slice is
what serves reads there (chosen over archiving the ConsumeQueue files, which hold entries of
other CommitLog files too and whose range does not line up with a CommitLog file's).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import operator
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import zstandard

from tidemq.storage.archive.config import COMPRESSIONS
from tidemq.storage.errors import StoreError
from tidemq.storage.mapped_file import offset_to_name
from tidemq.storage.record import END_OF_FILE, OK, RecordInfo
from tidemq.storage.record.block import scan_span
from tidemq.storage.record.decode import check_record
from tidemq.storage.record.layout import SYSFLAG_BORNHOST_V6

FORMAT_VERSION = 1
QUEUE_ENTRY = struct.Struct(">qiq")  # consume_queue.ENTRY
STORE_MS = struct.Struct(">q")
_HEADER_LEN = struct.Struct(">I")
# A record's SYSFLAG and, when its born host is IPv4, its store timestamp (record.layout: the
# timestamp follows the born host, 12 bytes further with an IPv6 one).
_FLAG_AND_STORE_MS = struct.Struct(">36xi16xq")
_STORE_MS_AFTER_V6_BORN_HOST = 68


class ArchiveError(StoreError):
    code = "ARCHIVE_ERROR"


class ArchiveUnavailableError(ArchiveError):
    """The archive could not be reached or refused a request; the same call may work later."""

    code = "ARCHIVE_UNAVAILABLE"
    retriable = True


class ArchiveCorruptError(ArchiveError):
    """An archived object does not match what its entry records (checksum, size, records): it is
    reported and never served."""

    code = "ARCHIVE_CORRUPT"


class ArchiveOwnedError(ArchiveError):
    """The archive belongs to another broker group (``owner.json``)."""

    code = "ARCHIVE_OWNED"


class SegmentNotArchivableError(ArchiveError):
    """A CommitLog file whose records do not check (CRC, shape, position): it is not archived and
    retention keeps it for an operator (``tidemq store check``)."""

    code = "SEGMENT_NOT_ARCHIVABLE"


def segment_name(base_offset: int) -> str:
    return offset_to_name(base_offset)


def chunk_key(name: str, index: int) -> str:
    return f"segments/{name}/chunk-{index:06d}"


def queues_key(name: str) -> str:
    return f"segments/{name}/queues"


def entry_key(name: str) -> str:
    return f"manifest/{name}.json"


MANIFEST_PREFIX = "manifest/"
# {"format_version": 1, "owner": "CLUSTER/BROKER_GROUP"}: whose CommitLog this archive holds.
OWNER_KEY = "owner.json"


@dataclass(frozen=True, slots=True)
class ChunkFacts:
    md5: str  # of the stored (compressed) bytes: what the object must be
    stored_bytes: int
    size_bytes: int  # uncompressed


@dataclass(frozen=True, slots=True)
class QueueSpan:
    """One queue's records in one archived file."""

    topic: str
    queue_id: int
    first_offset: int
    count: int
    first_entry: int

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.count


@dataclass(frozen=True)
class ManifestEntry:
    """``manifest/N.json``: one CommitLog file as archived."""

    name: str
    base_offset: int
    size_bytes: int  # the file's length (CommitLog files are all one size)
    archived: bool
    data_end_offset: int = 0  # where its last record ends (a blank marker may follow)
    sha256: str = ""  # of the whole uncompressed file
    compression: str = "none"
    chunk_bytes: int = 0
    chunks: tuple[ChunkFacts, ...] = ()
    queues_md5: str = ""
    records: int = 0
    first_store_ms: int = 0
    last_store_ms: int = 0
    # Per topic, per queue id: [first queue offset, count] (what reads past retention look up).
    queues: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    archived_at_ms: int = 0

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size_bytes

    @functools.cached_property
    def chunk_starts(self) -> tuple[int, ...]:
        """File-relative start of each chunk."""
        starts = [0]
        for c in self.chunks[:-1]:
            starts.append(starts[-1] + c.size_bytes)
        return tuple(starts)

    def chunk_of(self, phy: int) -> int:
        """The index of the chunk holding CommitLog offset ``phy`` (within this file)."""
        return bisect.bisect_right(self.chunk_starts, phy - self.base_offset) - 1

    @property
    def stored_bytes(self) -> int:
        return sum(c.stored_bytes for c in self.chunks)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "base_offset": self.base_offset,
            "size_bytes": self.size_bytes,
            "archived": self.archived,
        }
        if self.archived:
            doc.update(
                data_end_offset=self.data_end_offset,
                sha256=self.sha256,
                compression=self.compression,
                chunk_bytes=self.chunk_bytes,
                chunks=[[c.md5, c.stored_bytes, c.size_bytes] for c in self.chunks],
                queues_md5=self.queues_md5,
                records=self.records,
                first_store_ms=self.first_store_ms,
                last_store_ms=self.last_store_ms,
                queues={
                    t: {str(q): list(span) for q, span in qs.items()}
                    for t, qs in self.queues.items()
                },
            )
        doc["archived_at_ms"] = self.archived_at_ms
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: str = "") -> ManifestEntry:
        try:
            doc = json.loads(raw)
            if doc.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version {doc.get('format_version')!r}")
            archived = bool(doc["archived"])
            entry = cls(
                name=str(doc["name"]),
                base_offset=int(doc["base_offset"]),
                size_bytes=int(doc["size_bytes"]),
                archived=archived,
                archived_at_ms=int(doc.get("archived_at_ms", 0)),
            )
            if not archived:
                return entry
            compression = str(doc["compression"])
            if compression not in COMPRESSIONS:
                raise ValueError(f"unknown compression {compression!r}")
            return cls(
                name=entry.name,
                base_offset=entry.base_offset,
                size_bytes=entry.size_bytes,
                archived=True,
                data_end_offset=int(doc["data_end_offset"]),
                sha256=str(doc["sha256"]),
                compression=compression,
                chunk_bytes=int(doc["chunk_bytes"]),
                chunks=tuple(ChunkFacts(str(m), int(s), int(u)) for m, s, u in doc["chunks"]),
                queues_md5=str(doc["queues_md5"]),
                records=int(doc["records"]),
                first_store_ms=int(doc["first_store_ms"]),
                last_store_ms=int(doc["last_store_ms"]),
                queues={
                    str(t): {int(q): (int(a), int(n)) for q, (a, n) in qs.items()}
                    for t, qs in doc["queues"].items()
                },
                archived_at_ms=entry.archived_at_ms,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ArchiveCorruptError(
                f"archive manifest entry {key or '?'} is unreadable: {e}"
            ) from e


class SegmentScan(NamedTuple):
    """What walking one CommitLog file's records found (every CRC checked)."""

    records: int
    data_end: int  # file-relative end of the last record
    first_store_ms: int
    last_store_ms: int
    topics: frozenset[str]
    spans: tuple[QueueSpan, ...]
    entries: bytes  # the queue slice's ConsumeQueue entries, in ``spans`` order
    store_ms: bytes  # their store timestamps
    cuts: tuple[int, ...]  # file-relative start of each chunk (the first is 0)


def scan_segment(
    buf: bytes | memoryview, base_offset: int, record_crc: bool, chunk_bytes: int
) -> SegmentScan:
    """Walk a whole CommitLog file and check every record (shape, position, CRCs); raise
    ``SegmentNotArchivableError`` at the first that fails. A sealed file ends with a blank
    marker or exactly at its last record. Chunks are cut as the module docstring says.

    The walk is dispatch's compiled one (``record.block.scan_span``: the same checks as
    ``check_record``, every CRC) when it can answer for the whole file; a file it cannot (a
    record that fails, a transaction half, which has no queue entry, a queue whose offsets
    jump) is walked again record by record (``_scan_records``), which says what is wrong."""
    found = _scan_compiled(buf, base_offset, record_crc, chunk_bytes)
    if found is None:
        found = _scan_records(buf, base_offset, record_crc, chunk_bytes)
    return found


def _scan_compiled(
    buf: bytes | memoryview, base_offset: int, record_crc: bool, chunk_bytes: int
) -> SegmentScan | None:
    """``_scan_records``' answer from one ``scan_span`` over the file, or None when the file
    is not one it can answer for: every record valid, each with a queue entry (no transaction
    half), one run of consecutive queue offsets per queue."""
    limit = len(buf)
    span = scan_span(buf, 0, limit, base_offset, base_offset, record_crc, 0)
    if span.status == END_OF_FILE:
        data_end = span.end
    elif span.status == OK and span.end == limit:
        data_end = limit
    else:
        return None
    runs = sorted(span.runs, key=lambda r: (r[0], r[1]))
    if len({(r[0], r[1]) for r in runs}) != len(runs):
        return None  # a queue's offsets jump within the file
    entries = b"".join(r[3] for r in runs)
    records = len(entries) // QUEUE_ENTRY.size
    if records != span.scanned:
        return None  # transaction halves: records without a queue entry
    spans: list[QueueSpan] = []
    n = 0
    for topic, qid, first, packed in runs:
        count = len(packed) // QUEUE_ENTRY.size
        spans.append(QueueSpan(topic, qid, first, count, n))
        n += count
    # Every record has an entry and the records lie back to back from 0 to data_end: their
    # starts, sorted, are the records in log order.
    at = _FLAG_AND_STORE_MS.unpack_from
    starts = [phy - base_offset for phy, _size, _code in QUEUE_ENTRY.iter_unpack(entries)]
    flags, read_ms = zip(*[at(buf, pos) for pos in starts], strict=True) if starts else ((), ())
    stamps = list(read_ms)
    if functools.reduce(operator.or_, flags, 0) & SYSFLAG_BORNHOST_V6:
        for i, flag in enumerate(flags):
            if flag & SYSFLAG_BORNHOST_V6:  # the timestamp is further on
                (stamps[i],) = STORE_MS.unpack_from(buf, starts[i] + _STORE_MS_AFTER_V6_BORN_HOST)
    first_ms = last_ms = 0
    if records:
        first_ms = stamps[starts.index(0)]
        last_ms = max(0, *stamps)
    starts.sort()
    # A chunk is cut at the first record that would take it past chunk_bytes, unless that
    # record starts it (a record larger than chunk_bytes has a chunk of its own).
    ends = [*starts[1:], data_end]
    cuts = [0]
    j = 0  # the record the last cut starts at
    while records:
        i = max(bisect.bisect_right(ends, cuts[-1] + chunk_bytes), j + 1)
        if i >= records:
            break
        cuts.append(starts[i])
        j = i
    while limit - cuts[-1] > chunk_bytes:  # the blank tail: after the records, then evenly
        cuts.append(data_end if cuts[-1] < data_end else cuts[-1] + chunk_bytes)
    return SegmentScan(
        records, data_end, first_ms, last_ms, frozenset(r[0] for r in runs), tuple(spans),
        entries, struct.pack(f">{records}q", *stamps), tuple(cuts),
    )  # fmt: skip


def _scan_records(
    buf: bytes | memoryview, base_offset: int, record_crc: bool, chunk_bytes: int
) -> SegmentScan:
    """``scan_segment`` record by record (``check_record``): for any file, and the one that
    names what is wrong with a file that fails."""
    per_queue: dict[tuple[str, int], list[RecordInfo]] = {}
    pos = 0
    limit = len(buf)
    records = 0
    first_ms = last_ms = 0
    cuts = [0]
    while pos < limit:
        status, info = check_record(buf, pos, limit, True, base_offset + pos, record_crc)
        if status == END_OF_FILE:
            break
        if status != OK or not isinstance(info, RecordInfo):
            raise SegmentNotArchivableError(
                f"CommitLog file {segment_name(base_offset)}: no valid record at offset "
                f"{base_offset + pos}: {info}"
            )
        if pos > cuts[-1] and pos + info.size - cuts[-1] > chunk_bytes:
            cuts.append(pos)
        per_queue.setdefault((info.topic, info.queue_id), []).append(info)
        if records == 0:
            first_ms = info.store_timestamp_ms
        last_ms = max(last_ms, info.store_timestamp_ms)
        records += 1
        pos += info.size
    data_end = pos
    while limit - cuts[-1] > chunk_bytes:  # the blank tail: after the records, then evenly
        cuts.append(data_end if cuts[-1] < data_end else cuts[-1] + chunk_bytes)
    spans: list[QueueSpan] = []
    entries = bytearray()
    stamps = bytearray()
    n = 0
    for (topic, qid), infos in sorted(per_queue.items()):
        first = infos[0].queue_offset
        for i, info in enumerate(infos):
            if info.queue_offset != first + i:
                raise SegmentNotArchivableError(
                    f"CommitLog file {segment_name(base_offset)}: queue {topic}/{qid} jumps from "
                    f"offset {first + i - 1} to {info.queue_offset} at {info.phy_offset}"
                )
            entries += QUEUE_ENTRY.pack(info.phy_offset, info.size, info.entry_tag_code())
            stamps += STORE_MS.pack(info.store_timestamp_ms)
        spans.append(QueueSpan(topic, qid, first, len(infos), n))
        n += len(infos)
    topics = frozenset(t for t, _ in per_queue)
    return SegmentScan(
        records, data_end, first_ms, last_ms, topics, tuple(spans), bytes(entries),
        bytes(stamps), tuple(cuts),
    )  # fmt: skip


def encode_queue_slice(spans: Sequence[QueueSpan], entries: bytes, store_ms: bytes) -> bytes:
    header = json.dumps(
        {
            "entries": len(entries) // QUEUE_ENTRY.size,
            "queues": [
                [s.topic, s.queue_id, s.first_offset, s.count, s.first_entry] for s in spans
            ],
        },
        separators=(",", ":"),
    ).encode()
    return _HEADER_LEN.pack(len(header)) + header + entries + store_ms


class QueueSlice(NamedTuple):
    spans: dict[tuple[str, int], QueueSpan]
    entries: bytes  # packed ConsumeQueue entries
    store_ms: bytes

    def packed(self, span: QueueSpan, queue_offset: int, count: int) -> bytes:
        """The packed entries of ``count`` queue offsets from ``queue_offset`` in ``span``."""
        i = span.first_entry + queue_offset - span.first_offset
        n = min(count, span.end_offset - queue_offset)
        return self.entries[i * QUEUE_ENTRY.size : (i + n) * QUEUE_ENTRY.size]

    def entry(self, span: QueueSpan, queue_offset: int) -> tuple[int, int, int, int]:
        """(phy_offset, size, tag_code, store_timestamp_ms) of one queue offset in ``span``."""
        i = span.first_entry + queue_offset - span.first_offset
        phy, size, code = QUEUE_ENTRY.unpack_from(self.entries, i * QUEUE_ENTRY.size)
        (ms,) = STORE_MS.unpack_from(self.store_ms, i * STORE_MS.size)
        return phy, size, code, ms


def decode_queue_slice(raw: bytes, key: str = "") -> QueueSlice:
    try:
        (h,) = _HEADER_LEN.unpack_from(raw, 0)
        header = json.loads(raw[4 : 4 + h])
        n = int(header["entries"])
        at = 4 + h
        entries = raw[at : at + n * QUEUE_ENTRY.size]
        store_ms = raw[at + n * QUEUE_ENTRY.size :]
        if len(entries) != n * QUEUE_ENTRY.size or len(store_ms) != n * STORE_MS.size:
            raise ValueError(f"{len(raw)} bytes cannot hold {n} entries")
        spans: dict[tuple[str, int], QueueSpan] = {}
        for topic, qid, first, count, first_entry in header["queues"]:
            span = QueueSpan(str(topic), int(qid), int(first), int(count), int(first_entry))
            if span.first_entry < 0 or span.count < 1 or span.first_entry + span.count > n:
                raise ValueError(f"queue {topic}/{qid} runs past the entries")
            spans[span.topic, span.queue_id] = span
    except (struct.error, KeyError, TypeError, ValueError) as e:
        raise ArchiveCorruptError(f"archive queue slice {key or '?'} is unreadable: {e}") from e
    return QueueSlice(spans, entries, store_ms)


def md5_hex(data: bytes | memoryview) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


_decompressors = threading.local()  # a decompressor per thread, kept as Codec's compressors


class Codec:
    """A chunk's compression: zstd frames (each chunk alone) or none."""

    def __init__(self, name: str, level: int = 1) -> None:
        if name not in COMPRESSIONS:
            raise ArchiveError(f"unknown archive compression {name!r}; one of {COMPRESSIONS}")
        self.name = name
        self._level = level
        # A compressor per thread, kept (one is not thread-safe; building one per chunk costs).
        self._local = threading.local()

    def compress(self, data: bytes | memoryview) -> bytes:
        if self.name == "none":
            return bytes(data)
        cctx: zstandard.ZstdCompressor | None = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(
                level=self._level, write_checksum=True
            )
        return cctx.compress(data)

    @staticmethod
    def decompress(name: str, data: bytes, size_bytes: int | None, key: str) -> bytes:
        """``size_bytes``: what the object must decompress to (None: whatever its frame says)."""
        if name == "none":
            out = data
        else:
            dctx: zstandard.ZstdDecompressor | None = getattr(_decompressors, "dctx", None)
            if dctx is None:
                dctx = _decompressors.dctx = zstandard.ZstdDecompressor()
            try:
                out = dctx.decompress(data, max_output_size=size_bytes or 0)
            except zstandard.ZstdError as e:
                raise ArchiveCorruptError(
                    f"archived object {key} fails its checksum or does not decompress (zstd: {e})"
                ) from e
        if size_bytes is not None and len(out) != size_bytes:
            raise ArchiveCorruptError(
                f"archived object {key} holds {len(out)} bytes, its entry says {size_bytes}"
            )
        return out
