"""Archiving one CommitLog file, verifying one, restoring one: the steps, on bytes and a backend.

``archive_segment`` (docs/archive.md, "What archiving does"):

1. walk every record of the file, CRCs checked (a file that fails is not archived);
2. cut it into chunks, compress each, and put each chunk that is not already there with the
   right MD5 (a crash mid-upload resumes where it stopped: nothing is sent twice);
3. put the queue slice;
4. read everything back, decompress it, and check the MD5s, the file's SHA-256, and every
   record's CRC again, now from the archived bytes;
5. only then put the manifest entry. Retention deletes a local file only once its entry exists.

The work that releases the GIL (compressing, hashing, decompressing, reading chunks back) runs on
a few worker threads (``workers``) beside the caller, a few chunks ahead of the puts, which stay
in order in the caller's thread: the bytes, the order of the puts and the errors are what a
single thread would give, and a core the machine has to spare compresses the next chunks while
this one is written and synced.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tidemq.storage.archive.backends import ArchiveBackend
from tidemq.storage.archive.format import (
    ArchiveCorruptError,
    ChunkFacts,
    Codec,
    ManifestEntry,
    SegmentNotArchivableError,
    chunk_key,
    decode_queue_slice,
    encode_queue_slice,
    entry_key,
    md5_hex,
    queues_key,
    scan_segment,
    segment_name,
)

# Worker threads for archive work: as many as the machine has cores, up to 4 (each chunk's
# compression or decompression is one task).
WORKERS = max(1, min(4, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def workers() -> ThreadPoolExecutor:
    """The worker threads of archive work (archiving and verifying), started on first use. A
    task never waits for another task."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="archive-worker")
        return _pool


@contextmanager
def _settled(futures: deque[Future[Any]]) -> Iterator[None]:
    """On the way out (an error included), cancel what has not started and wait for what has:
    a task may hold a view of the caller's buffer, which must outlive it."""
    try:
        yield
    finally:
        for f in futures:
            f.cancel()
        wait(futures)


def _compressed(codec: Codec, data: memoryview, start: int, end: int) -> tuple[bytes, str]:
    # The slice is released here, before the task completes: once the caller has seen every
    # task complete, nothing holds its buffer (the store's mapping may then be closed).
    with data[start:end] as piece:
        stored = codec.compress(piece)
    return stored, md5_hex(stored)


def _sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class UploadCounts:
    """What one ``archive_segment`` call sent (chunks found already archived are not sent)."""

    chunks_sent: int = 0
    chunks_reused: int = 0
    bytes_sent: int = 0


def archive_segment(
    backend: ArchiveBackend,
    data: bytes | memoryview,
    base_offset: int,
    *,
    record_crc: bool,
    codec: Codec,
    chunk_bytes: int,
    wants: Callable[[str], bool] | None = None,
    now_ms: int | None = None,
) -> tuple[ManifestEntry, UploadCounts]:
    """Archive one sealed CommitLog file (``data``, its whole bytes). ``wants``, when given,
    says whether a topic's policy is ``archive``: a file holding none of those is recorded
    as not archived and nothing is uploaded. Raises ``SegmentNotArchivableError`` for a file
    whose records do not check, ``ArchiveUnavailableError`` when the archive cannot be
    written, ``ArchiveCorruptError`` when what was written does not read back the same."""
    name = segment_name(base_offset)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    scan = scan_segment(data, base_offset, record_crc, chunk_bytes)
    counts = UploadCounts()
    if wants is not None and not any(wants(t) for t in scan.topics):
        entry = ManifestEntry(name, base_offset, len(data), archived=False, archived_at_ms=now_ms)
        backend.put(entry_key(name), entry.to_json())
        return entry, counts
    chunks: list[ChunkFacts] = []
    pool = workers()
    tasks: deque[Future[Any]] = deque()
    with memoryview(data) as mv, _settled(tasks):
        digest = pool.submit(_sha256_hex, mv)
        tasks.append(digest)
        bounds = list(zip(scan.cuts, (*scan.cuts[1:], len(mv)), strict=True))
        ahead: deque[Future[tuple[bytes, str]]] = deque()
        for start, end in bounds[: WORKERS + 1]:
            ahead.append(pool.submit(_compressed, codec, mv, start, end))
        tasks.extend(ahead)
        for i, (start, end) in enumerate(bounds):
            stored, md5 = ahead.popleft().result()
            if i + WORKERS + 1 < len(bounds):  # keep the workers a few chunks ahead
                ahead.append(pool.submit(_compressed, codec, mv, *bounds[i + WORKERS + 1]))
                tasks.append(ahead[-1])
            key = chunk_key(name, i)
            if backend.md5(key) == md5:
                counts.chunks_reused += 1
            else:
                backend.put(key, stored)
                counts.chunks_sent += 1
                counts.bytes_sent += len(stored)
            chunks.append(ChunkFacts(md5, len(stored), end - start))
        sha256 = digest.result()
    slice_raw = codec.compress(encode_queue_slice(scan.spans, scan.entries, scan.store_ms))
    backend.put(queues_key(name), slice_raw)
    queues: dict[str, dict[int, tuple[int, int]]] = {}
    for span in scan.spans:
        queues.setdefault(span.topic, {})[span.queue_id] = (span.first_offset, span.count)
    entry = ManifestEntry(
        name=name,
        base_offset=base_offset,
        size_bytes=len(data),
        archived=True,
        data_end_offset=base_offset + scan.data_end,
        sha256=sha256,
        compression=codec.name,
        chunk_bytes=chunk_bytes,
        chunks=tuple(chunks),
        queues_md5=md5_hex(slice_raw),
        records=scan.records,
        first_store_ms=scan.first_store_ms,
        last_store_ms=scan.last_store_ms,
        queues=queues,
        archived_at_ms=now_ms,
    )
    verify_segment(backend, entry, record_crc=record_crc)
    backend.put(entry_key(name), entry.to_json())
    return entry, counts


def fetch_chunk(
    backend: ArchiveBackend, entry: ManifestEntry, index: int, *, md5: bool = True
) -> bytes:
    """One chunk, decompressed, after its MD5 is checked against the entry. ``md5=False`` (reads
    past retention) skips that for a zstd chunk: its frame carries its content's checksum
    (XXH64), which decompression checks, at a fraction of MD5's cost, and every record read
    from it is CRC-checked again."""
    key = chunk_key(entry.name, index)
    facts = entry.chunks[index]
    stored = backend.get(key)
    if stored is None:
        raise ArchiveCorruptError(f"archived object {key} is missing")
    if (md5 or entry.compression == "none") and md5_hex(stored) != facts.md5:
        raise ArchiveCorruptError(f"archived object {key} fails its checksum (MD5)")
    return Codec.decompress(entry.compression, stored, facts.size_bytes, key)


def fetch_segment(backend: ArchiveBackend, entry: ManifestEntry) -> bytes:
    """The whole archived file, every chunk checked, and its SHA-256 against the entry. The
    chunks are fetched on the worker threads; the error is the first chunk's that fails."""
    pool = workers()
    fetches = deque(pool.submit(fetch_chunk, backend, entry, i) for i in range(len(entry.chunks)))
    with _settled(fetches):
        data = b"".join(f.result() for f in fetches)
    if len(data) != entry.size_bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ArchiveCorruptError(
            f"archived CommitLog file {entry.name} fails its checksum (SHA-256 of the file)"
        )
    return data


def verify_segment(backend: ArchiveBackend, entry: ManifestEntry, *, record_crc: bool) -> None:
    """Read an archived file back and check all of it: each chunk's MD5, the file's SHA-256,
    every record's CRC, and that the queue slice says what the records say."""
    if not entry.archived:
        return
    data = fetch_segment(backend, entry)
    try:
        scan = scan_segment(data, entry.base_offset, record_crc, entry.chunk_bytes)
    except SegmentNotArchivableError as e:
        raise ArchiveCorruptError(f"archived CommitLog file {entry.name}: {e}") from e
    if scan.records != entry.records or entry.base_offset + scan.data_end != entry.data_end_offset:
        raise ArchiveCorruptError(
            f"archived CommitLog file {entry.name} holds {scan.records} records, its entry says "
            f"{entry.records}"
        )
    key = queues_key(entry.name)
    raw = backend.get(key)
    if raw is None or md5_hex(raw) != entry.queues_md5:
        raise ArchiveCorruptError(f"archived object {key} is missing or fails its checksum")
    got = decode_queue_slice(Codec.decompress(entry.compression, raw, None, key), key)
    if scan.cuts != entry.chunk_starts:
        raise ArchiveCorruptError(f"archived CommitLog file {entry.name}: chunks not at records")
    if (
        set(got.spans.values()) != set(scan.spans)
        or got.entries != scan.entries
        or got.store_ms != scan.store_ms
    ):
        raise ArchiveCorruptError(f"archived object {key} does not match the file's records")


def read_entry(backend: ArchiveBackend, key: str) -> ManifestEntry:
    raw = backend.get(key)
    if raw is None:
        raise ArchiveCorruptError(f"archive manifest entry {key} is missing")
    return ManifestEntry.from_json(raw, key)
