"""The message key index: RocketMQ's IndexFile, byte for byte (the directory of them is
``index_service``'s).

One index file is a fixed-size hash table with chaining, all integers big-endian::

    +--------------------------------------------------------------+  offset 0
    | header, 40 bytes                                             |
    |   int64 beginTimestamp   int64 endTimestamp                  |  0, 8
    |   int64 beginPhyOffset   int64 endPhyOffset                  |  16, 24
    |   int32 hashSlotCount    int32 indexCount (starts at 1)      |  32, 36
    +--------------------------------------------------------------+  40
    | slot_num slots, 4 bytes each: int32 newest entry no, 0=empty |
    +--------------------------------------------------------------+  40 + slot_num*4
    | max_index_num entries, 20 bytes each (entry 0 never used):   |
    |   int32 keyHash  int64 phyOffset  int32 timeDiff  int32 prev |  4 + 8 + 4 + 4 = 20
    +--------------------------------------------------------------+  40 + slot_num*4
                                                                         + max_index_num*20

Entry n sits at 40 + slot_num*4 + n*20. With the defaults (5,000,000 slots, 20,000,000 entries)
a file is 40 + 20,000,000 + 400,000,000 = 420,000,040 bytes. keyHash is abs(Java hashCode) of
"topic#key", the slot is keyHash % slot_num, timeDiff is whole seconds since beginTimestamp clamped
to [0, 2^31-1], prev is the entry previously at the head of the same slot (0 ends the chain).

Two deliberate choices beyond RocketMQ:

* endTimestamp is the last entry's time as the entry records it (beginTimestamp + timeDiff*1000),
  not the raw store time. The header is then a function of the entries, so ``trim_to`` and
  ``repair_torn`` restore it byte for byte; no query can tell the difference, because entries are
  matched on that same second-granularity time.
* A put writes entry, slot, header body and indexCount in that order, so indexCount is the commit
  point: anything at or beyond it is a torn put that ``repair_torn`` rolls back. After a kill that
  lands in the very first put of a file, the begin fields may keep the torn values; an empty file's
  header means nothing and the next put overwrites them.

Durability is the caller's: ``flush`` (msync) is what survives power loss; a killed process loses
nothing that reached the mapping.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from array import array
from collections.abc import Iterator, Sequence

from tidemq.storage.allocate import allocate
from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.errors import ConfigError, CorruptStoreError
from tidemq.storage.javahash import index_key_hash

_HEADER = struct.Struct(">qqqqii")
# Everything but indexCount, which is written on its own and last: it is the commit point.
_HEADER_BODY = struct.Struct(">qqqqi")
_I32 = struct.Struct(">i")  # a slot, and the indexCount field
_ENTRY = struct.Struct(">iqii")

HEADER_SIZE = _HEADER.size
SLOT_SIZE = _I32.size
ENTRY_SIZE = _ENTRY.size
_INDEX_COUNT_AT = _HEADER_BODY.size
DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_MAX_INDEX_NUM = 20_000_000
_INT32_MAX = 2**31 - 1
_ZERO_ENTRY = bytes(ENTRY_SIZE)


def index_file_size(slot_num: int, max_index_num: int) -> int:
    """Bytes in an index file of this layout."""
    if not 1 <= slot_num <= _INT32_MAX or not 2 <= max_index_num <= _INT32_MAX:
        # Entry 0 is never used, so a file needs room for at least one more.
        raise ConfigError(f"index layout needs 1 <= slots and 2 <= entries <= {_INT32_MAX}")
    return HEADER_SIZE + slot_num * SLOT_SIZE + max_index_num * ENTRY_SIZE


class IndexFile:
    """One mapped index file. Not thread-safe: ``IndexService`` serialises access."""

    def __init__(self, path: str, mm: mmap.mmap, slot_num: int, max_index_num: int) -> None:
        self.path = path
        self._mm = mm
        self._slot_num = slot_num
        self._max = max_index_num
        self._entries_at = HEADER_SIZE + slot_num * SLOT_SIZE
        header: tuple[int, int, int, int, int, int] = _HEADER.unpack_from(mm, 0)
        self._begin_ts, self._end_ts, self._begin_phy, self._end_phy = header[:4]
        self._slot_count, self._count = header[4:]

    @classmethod
    def create(
        cls,
        path: str,
        slot_num: int,
        max_index_num: int,
        begin_phy_offset: int,
        begin_timestamp: int,
    ) -> IndexFile:
        size = index_file_size(slot_num, max_index_num)
        if os.path.exists(path):
            raise FileExistsError(path)
        # Built under a temporary name and renamed once the header is durable, so a crash never
        # leaves a full-size file of zeros (indexCount 0) under a real name.
        tmp = path + ".tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # left by a create that died before its rename
        allocate(tmp, size)
        fd = os.open(tmp, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
            _HEADER.pack_into(
                mm, 0, begin_timestamp, begin_timestamp, begin_phy_offset, begin_phy_offset, 0, 1
            )
            # fsync also writes back pages dirtied through a shared mapping of the file.
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
        return cls(path, mm, slot_num, max_index_num)

    @classmethod
    def open(cls, path: str, slot_num: int, max_index_num: int) -> IndexFile:
        size = index_file_size(slot_num, max_index_num)
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise CorruptStoreError(
                    f"index file {path} is {actual} bytes, the layout of {slot_num} slots and "
                    f"{max_index_num} entries needs {size}"
                )
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        f = cls(path, mm, slot_num, max_index_num)
        if not 1 <= f._count <= max_index_num or not 0 <= f._slot_count <= slot_num:
            f.close()
            raise CorruptStoreError(
                f"index file {path} has a nonsense header: indexCount {f._count}, "
                f"hashSlotCount {f._slot_count}"
            )
        return f

    @property
    def begin_timestamp(self) -> int:
        return self._begin_ts

    @property
    def end_timestamp(self) -> int:
        return self._end_ts

    @property
    def begin_phy_offset(self) -> int:
        return self._begin_phy

    @property
    def end_phy_offset(self) -> int:
        return self._end_phy

    @property
    def hash_slot_count(self) -> int:
        return self._slot_count

    @property
    def index_count(self) -> int:
        return self._count

    @property
    def is_full(self) -> bool:
        return self._count >= self._max

    def _slot_at(self, key_hash: int) -> int:
        return HEADER_SIZE + (key_hash % self._slot_num) * SLOT_SIZE

    def _entry_at(self, n: int) -> int:
        return self._entries_at + n * ENTRY_SIZE

    def _entry(self, n: int) -> tuple[int, int, int, int]:
        key_hash, phy, diff, prev = _ENTRY.unpack_from(self._mm, self._entry_at(n))
        return key_hash, phy, diff, prev

    def _slot(self, pos: int) -> int:
        value: int = _I32.unpack_from(self._mm, pos)[0]
        return value

    def write_header(self) -> None:
        body = _HEADER_BODY.pack(
            self._begin_ts, self._end_ts, self._begin_phy, self._end_phy, self._slot_count
        )
        _store(self._mm, 0, body)
        _store(self._mm, _INDEX_COUNT_AT, _I32.pack(self._count))

    def _set_end_from_last_entry(self) -> None:
        if self._count > 1:
            _, self._end_phy, diff, _ = self._entry(self._count - 1)
            self._end_ts = self._begin_ts + diff * 1000
        else:
            self._end_phy, self._end_ts = self._begin_phy, self._begin_ts

    def put_key(self, key: str, phy_offset: int, store_timestamp_ms: int) -> bool:
        """Index ``key`` (already "topic#key"); False when the file is full."""
        return self.put_keys((key,), phy_offset, store_timestamp_ms) == 1

    def put_keys(self, keys: Sequence[str], phy_offset: int, store_timestamp_ms: int) -> int:
        """Index one message's keys (each already "topic#key"); returns how many fit."""
        hashes = [index_key_hash(k) for k in keys]
        put = self.put_hashes(hashes, phy_offset, store_timestamp_ms)
        if put:
            self.write_header()
        return put

    def put_hashes(self, hashes: Sequence[int], phy_offset: int, store_timestamp_ms: int) -> int:
        """Index one message's key hashes; returns how many fit. The header is the caller's to
        write (``write_header``), once for however many messages it puts in a row.

        Each entry is written before its slot, and the header (indexCount last) after them. A
        kill in between leaves entries past indexCount, which ``repair_torn`` undoes."""
        n = self._count
        if n > 1 and phy_offset < self._end_phy:
            # trim_to relies on offsets never decreasing inside a file.
            raise ValueError(f"index offset {phy_offset} is below {self._end_phy} in {self.path}")
        if n == 1:
            # Set before timeDiff is taken (RocketMQ takes it against the rolled-over begin), so
            # the first entry is always at diff 0.
            self._begin_ts, self._begin_phy = store_timestamp_ms, phy_offset
        diff = min(max((store_timestamp_ms - self._begin_ts) // 1000, 0), _INT32_MAX)
        mm = self._mm
        slots = self._slot_num
        entries_at = self._entries_at
        put = 0
        for key_hash in hashes:
            if n >= self._max:
                break
            slot_pos = HEADER_SIZE + (key_hash % slots) * SLOT_SIZE
            head = _I32.unpack_from(mm, slot_pos)[0]
            _ENTRY.pack_into(
                mm,
                entries_at + n * ENTRY_SIZE,
                key_hash,
                phy_offset,
                diff,
                head if 0 < head < n else 0,
            )
            _store(mm, slot_pos, _I32.pack(n))
            if head == 0:
                self._slot_count += 1
            n += 1
            put += 1
        if put:
            self._end_ts = self._begin_ts + diff * 1000
            self._end_phy = phy_offset
            self._count = n
        return put

    def select(self, key: str, begin_ms: int, end_ms: int, max_num: int) -> list[int]:
        """Offsets of entries whose hash matches ``key`` and time is in range, newest first."""
        found: list[int] = []
        key_hash = index_key_hash(key)
        n = self._slot(self._slot_at(key_hash))
        if max_num <= 0 or not 0 < n < self._count:
            return found
        while True:
            entry_hash, phy, diff, prev = self._entry(n)
            if diff < 0:
                break
            ts = self._begin_ts + diff * 1000
            if entry_hash == key_hash and begin_ms <= ts <= end_ms:
                found.append(phy)
                if len(found) >= max_num:
                    break
            # Chains only point backwards; anything else is damage, and stopping keeps us finite.
            if not 0 < prev < n or ts < begin_ms:
                break
            n = prev
        return found

    def iter_entries(self, reverse: bool = False) -> Iterator[tuple[int, int, int, int]]:
        """(entry_no, key_hash, phy_offset, timestamp_ms) for every committed entry."""
        numbers = range(self._count - 1, 0, -1) if reverse else range(1, self._count)
        for n in numbers:
            key_hash, phy, diff, _ = self._entry(n)
            yield n, key_hash, phy, self._begin_ts + diff * 1000

    def trim_to(self, phy_offset: int) -> int:
        """Remove every entry with phyOffset >= ``phy_offset``; returns how many went."""
        old = self._count
        first = old
        while first > 1 and self._entry(first - 1)[1] >= phy_offset:
            first -= 1
        if first == old:
            return 0
        # Undo the puts newest first on a scratch copy of the touched slots, so the header (the
        # commit point) can go out before any slot changes: a kill halfway leaves a state that
        # repair_torn finishes.
        heads: dict[int, int] = {}
        for n in range(old - 1, first - 1, -1):
            key_hash, _, _, prev = self._entry(n)
            pos = self._slot_at(key_hash)
            if heads.get(pos, self._slot(pos)) == n:
                heads[pos] = prev
        self._slot_count -= sum(1 for pos, v in heads.items() if v == 0 and self._slot(pos) != 0)
        self._count = first
        self._set_end_from_last_entry()
        self.write_header()
        for n in range(old - 1, first - 1, -1):
            key_hash, _, _, prev = self._entry(n)
            pos = self._slot_at(key_hash)
            if self._slot(pos) == n:
                _store(self._mm, pos, _I32.pack(prev))
            at = self._entry_at(n)
            self._mm[at : at + ENTRY_SIZE] = _ZERO_ENTRY
        return old - first

    def repair_torn(self) -> int:
        """Roll back puts that never reached indexCount; returns how many entries it cleaned."""
        count = self._count
        cleaned = 0
        for n in range(count, self._max):
            at = self._entry_at(n)
            raw = self._mm[at : at + ENTRY_SIZE]
            # A torn entry whose bytes are all zero (hash 0, offset 0) may still own slot 0.
            pos = self._slot_at(_ENTRY.unpack(raw)[0])
            head = self._slot(pos)
            fixed = head >= count
            while count <= head:
                prev = self._entry(head)[3] if head < self._max else 0
                head = prev if prev < head else 0
            if fixed:
                _store(self._mm, pos, _I32.pack(head))
            if raw == _ZERO_ENTRY and not fixed:
                break
            self._mm[at : at + ENTRY_SIZE] = _ZERO_ENTRY
            cleaned += 1
        if cleaned:
            # The torn put may or may not have written the header body; rebuild it from what the
            # committed entries and slots say.
            slots = array("i", self._mm[HEADER_SIZE : self._entries_at])
            self._slot_count = self._slot_num - slots.count(0)
            self._set_end_from_last_entry()
            self.write_header()
        return cleaned

    def flush(self) -> None:
        # fdatasync, not mmap.flush: CPython's msync holds the GIL for the whole write-back and
        # would freeze every other thread; Linux writes back pages dirtied through the mapping.
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def destroy(self) -> None:
        self.close()
        os.unlink(self.path)


def _store(mm: mmap.mmap, pos: int, data: bytes) -> None:
    """Overwrite committed bytes (slots, header) with a plain copy.

    Never ``Struct.pack_into`` for these: CPython zero-fills the target before packing into it,
    so a process killed in between leaves zeros where a committed value was: a slot of 0 loses
    its whole chain, an indexCount of 0 makes the file unreadable. A copy only ever shows the old
    bytes, the new ones, or (for the multi-field header) a mix that repair_torn rebuilds.
    """
    mm[pos : pos + len(data)] = data
