"""Reads past local retention: records, queue entries and time searches served from an archive.

The manifest is read once and then refreshed (new entries only: entries never change once
written). Chunks are fetched whole, checked (MD5 against the entry) and kept decompressed in an
LRU cache bounded by ``cache_bytes``; queue slices likewise. A corrupt object is reported (the
error names it) and never served: the read fails with ``ArchiveCorruptError``.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tidemq.storage.archive.backends import ArchiveBackend
from tidemq.storage.archive.format import (
    MANIFEST_PREFIX,
    ArchiveCorruptError,
    Codec,
    ManifestEntry,
    QueueSlice,
    decode_queue_slice,
    md5_hex,
    queues_key,
)
from tidemq.storage.archive.segments import fetch_chunk, read_entry
from tidemq.storage.errors import CorruptRecordError
from tidemq.storage.record import StoredMessage
from tidemq.storage.record.block import gather_records
from tidemq.storage.record.decode import read_record
from tidemq.storage.record.gather import ENTRY_SIZE, OTHER_FILE

log = logging.getLogger(__name__)
K = TypeVar("K")
V = TypeVar("V")
_PHY = struct.Struct(">q")


@dataclass
class ReadCounts:
    chunk_fetches: int = 0
    chunk_hits: int = 0
    corrupt: int = 0


class _Lru(OrderedDict[K, V]):
    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.bytes = 0
        self._size = size

    def take(self, key: K) -> V | None:
        v = self.get(key)
        if v is not None:
            self.move_to_end(key)
        return v

    def keep(self, key: K, value: V) -> None:
        if key in self:
            return
        self[key] = value
        self.bytes += self._size(value)
        while self.bytes > self.max_bytes and len(self) > 1:
            _, old = self.popitem(last=False)
            self.bytes -= self._size(old)


class ArchiveReader:
    def __init__(self, backend: ArchiveBackend, *, cache_bytes: int, record_crc: bool) -> None:
        self.backend = backend
        self._record_crc = record_crc
        self._lock = threading.Lock()
        self._entries: dict[str, ManifestEntry] = {}
        self._archived: list[ManifestEntry] = []  # archived ones, by base offset
        self._bases: list[int] = []
        self._chunks: _Lru[tuple[str, int], bytes] = _Lru(cache_bytes, len)
        self._slices: _Lru[str, QueueSlice] = _Lru(
            max(cache_bytes // 4, 1 << 20), lambda s: len(s.entries)
        )
        self.counts = ReadCounts()
        # Until the manifest was read once, no read can tell an archived range from a gap.
        self.loaded = False
        # Why this store may not use the archive at all (another group's), when it may not.
        self.refused = ""

    # ----------------------------------------------------------------- manifest
    def refresh(self) -> list[ManifestEntry]:
        """Read entries written since the last refresh; returns them."""
        new: list[ManifestEntry] = []
        for key in self.backend.list(MANIFEST_PREFIX):
            name = key[len(MANIFEST_PREFIX) :].removesuffix(".json")
            if not key.endswith(".json") or name in self._entries:
                continue
            new.append(read_entry(self.backend, key))
        if new:
            with self._lock:
                for e in new:
                    self._entries[e.name] = e
                self._archived = sorted(
                    (e for e in self._entries.values() if e.archived), key=lambda e: e.base_offset
                )
                self._bases = [e.base_offset for e in self._archived]
        self.loaded = True
        return new

    def add(self, entry: ManifestEntry) -> None:
        """An entry this process just wrote (no need to list the archive for it)."""
        with self._lock:
            self._entries[entry.name] = entry
            if entry.archived:
                self._archived = sorted([*self._archived, entry], key=lambda e: e.base_offset)
                self._bases = [e.base_offset for e in self._archived]

    def entries(self) -> list[ManifestEntry]:
        """Every entry (archived or not), by base offset."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.base_offset)

    def has(self, name: str) -> bool:
        return name in self._entries

    @property
    def min_offset(self) -> int | None:
        """The first archived CommitLog byte, or None with nothing archived."""
        return self._bases[0] if self._bases else None

    def _entry_at(self, phy: int) -> ManifestEntry | None:
        with self._lock:
            bases, archived = self._bases, self._archived
        i = bisect.bisect_right(bases, phy) - 1
        if i < 0:
            return None
        e = archived[i]
        return e if phy < e.end_offset else None

    # ----------------------------------------------------------------- bytes
    def _chunk(self, entry: ManifestEntry, index: int) -> bytes:
        key = (entry.name, index)
        with self._lock:
            hit = self._chunks.take(key)
        if hit is not None:
            self.counts.chunk_hits += 1
            return hit
        try:
            data = fetch_chunk(self.backend, entry, index, md5=False)
        except ArchiveCorruptError as e:
            self.counts.corrupt += 1
            log.error("archive read refused: %s", e)  # noqa: TRY400 - the message says it all
            raise
        self.counts.chunk_fetches += 1
        with self._lock:
            self._chunks.keep(key, data)
        return data

    def _record_chunk(self, phy: int) -> tuple[ManifestEntry, int, bytes]:
        """The archived file and chunk holding the record at ``phy``: (entry, the chunk's log
        offset, its bytes). Chunks start at records, so a record lies in one chunk."""
        entry = self._entry_at(phy)
        if entry is None or phy >= entry.data_end_offset:
            raise ArchiveCorruptError(f"no archived record at CommitLog offset {phy}")
        i = entry.chunk_of(phy)
        return entry, entry.base_offset + entry.chunk_starts[i], self._chunk(entry, i)

    def record(self, phy: int) -> StoredMessage:
        """The archived record at ``phy``, every check a local read makes (CRCs included)."""
        _entry, base, chunk = self._record_chunk(phy)
        got = read_record(chunk, phy - base, len(chunk), phy, self._record_crc)
        if isinstance(got, str):
            self.counts.corrupt += 1
            raise ArchiveCorruptError(f"archived record at CommitLog offset {phy}: {got}")
        return got

    # ----------------------------------------------------------------- queues
    def _slice(self, entry: ManifestEntry) -> QueueSlice:
        with self._lock:
            hit = self._slices.take(entry.name)
        if hit is not None:
            return hit
        key = queues_key(entry.name)
        raw = self.backend.get(key)
        if raw is None or md5_hex(raw) != entry.queues_md5:
            self.counts.corrupt += 1
            raise ArchiveCorruptError(f"archived object {key} is missing or fails its checksum")
        got = decode_queue_slice(Codec.decompress(entry.compression, raw, None, key), key)
        with self._lock:
            self._slices.keep(entry.name, got)
        return got

    def _files_of(self, topic: str, queue_id: int) -> list[ManifestEntry]:
        with self._lock:
            archived = self._archived
        return [e for e in archived if queue_id in e.queues.get(topic, {})]

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """The queue offsets [min, end) the archive holds for one queue, or None."""
        files = self._files_of(topic, queue_id)
        if not files:
            return None
        first, _ = files[0].queues[topic][queue_id]
        last_first, last_count = files[-1].queues[topic][queue_id]
        return first, last_first + last_count

    def gather(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_codes: set[int] | None,
        tags: set[str] | None,
        out: bytearray,
    ) -> tuple[int, int] | None:
        """Append to ``out`` the stored bytes of the queue's archived records from ``offset``,
        within the one archived file that holds it, as a local read gathers them
        (``record.gather``: the same checks and limits, compiled): returns (entries got past,
        records appended), or None when no archived file holds ``offset``."""
        for entry in self._files_of(topic, queue_id):
            first, count = entry.queues[topic][queue_id]
            if not first <= offset < first + count:
                continue
            qs = self._slice(entry)
            span = qs.spans.get((topic, queue_id))
            if span is None:
                raise ArchiveCorruptError(f"{queues_key(entry.name)} lacks {topic}/{queue_id}")
            packed = qs.packed(span, offset, max(max_count * 16, 256))
            consumed = records = 0
            with memoryview(packed) as entries:
                while consumed * ENTRY_SIZE < len(entries) and records < max_count:
                    (phy,) = _PHY.unpack_from(entries, consumed * ENTRY_SIZE)
                    _e, base, chunk = self._record_chunk(phy)
                    try:
                        got = gather_records(
                            chunk, base, len(chunk), base + len(chunk), base + len(chunk),
                            entries[consumed * ENTRY_SIZE :], tag_codes, tags,
                            max_count - records, max_bytes, out, self._record_crc,
                        )  # fmt: skip
                    except CorruptRecordError as e:
                        self.counts.corrupt += 1
                        raise ArchiveCorruptError(f"archived {e}") from e
                    consumed += got.consumed
                    records += got.records
                    if got.stop != OTHER_FILE:
                        break
            return consumed, records
        return None

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first archived queue offset stored at or after ``timestamp_ms``; None when every
        archived message of the queue is older."""
        for entry in self._files_of(topic, queue_id):
            if entry.last_store_ms < timestamp_ms:
                continue
            first, count = entry.queues[topic][queue_id]
            qs = self._slice(entry)
            span = qs.spans[topic, queue_id]
            lo, hi = first, first + count
            while lo < hi:
                mid = (lo + hi) // 2
                if qs.entry(span, mid)[3] < timestamp_ms:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < first + count:
                return lo
        return None
