"""A pull's per-record loop: the stored bytes of the records a run of ConsumeQueue entries points
at, each checked as ``CommitLog.read`` checks one, appended back to back to one buffer.

The entries come packed as the ConsumeQueue stores them, 20 bytes each, big-endian::

    +----------------------+--------------+------------------------+
    | CommitLog offset (8) | size (4)     | tag code (8)           |
    +----------------------+--------------+------------------------+

and the records from one CommitLog file (its mapping, whose first byte is log offset ``base``).
Entry by entry, in the order and with the answers of ``StoreReader.get_messages``:

1. a blank entry (offset 0, size 0x7FFFFFFF: the padding before a replica's first entry) is
   skipped;
2. a record ending past ``visible`` (not dispatched yet, or past the confirm offset) stops the
   run: ``NOT_VISIBLE``;
3. with ``tag_codes``, an entry whose tag code is not one of them is skipped;
4. a record that would take ``out`` past ``max_bytes`` stops the run, ``BYTE_LIMIT``, unless
   ``out`` is empty: a pull answers at least one record, however large;
5. a record in another file stops the run, ``OTHER_FILE``: the caller finds that file (or the
   reason there is none) and goes on from the same entry;
6. the record is checked (shape, position, CRCs; ``decode.read_record``) and a bad one raises
   ``CorruptRecordError``, as ``CommitLog.read`` does;
7. with ``tags``, a record whose TAGS is none of them is skipped: tag codes are hashes and
   collide;
8. its bytes are appended to ``out``; after ``max_records`` records the run stops,
   ``RECORD_LIMIT``.

Every entry the run got past counts in ``consumed`` (so the next queue offset is the first
entry's plus ``consumed``); the run ends ``ENTRIES_END`` when it got past them all.

``py_gather_records`` is the pure-Python twin of ``_cblock.gather_records``; ``block`` chooses
which one runs (``block.gather_records``).
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from typing import Final, NamedTuple

from tidemq.storage.errors import CorruptRecordError
from tidemq.storage.record.decode import read_record
from tidemq.storage.record.layout import Buf
from tidemq.storage.record.messages import StoredMessage

ENTRY: Final = struct.Struct(">qiq")
ENTRY_SIZE: Final = 20
# consume_queue.BLANK_ENTRY's offset and size fields (the codec imports nothing of the store).
_BLANK_PHY: Final = 0
_BLANK_SIZE_FIELD: Final = 0x7FFFFFFF

# Why a run stopped.
ENTRIES_END: Final = 0
RECORD_LIMIT: Final = 1
BYTE_LIMIT: Final = 2
NOT_VISIBLE: Final = 3
OTHER_FILE: Final = 4


class GatherResult(NamedTuple):
    consumed: int  # entries got past: skipped or appended
    records: int  # records appended to ``out``
    nbytes: int  # bytes appended to ``out``
    stop: int  # ENTRIES_END, RECORD_LIMIT, BYTE_LIMIT, NOT_VISIBLE or OTHER_FILE


def _read(
    buf: Buf, pos: int, limit: int, phy: int, require_record_crc: bool
) -> StoredMessage | str:
    try:
        return read_record(buf, pos, limit, phy, require_record_crc)
    except struct.error:  # a header or length field past the buffer's end (block._check)
        return "body length runs past the record"


def py_gather_records(
    buf: Buf,
    base: int,
    written: int,
    readable: int,
    visible: int,
    entries: Buf,
    tag_codes: Collection[int] | None,
    tags: Collection[str] | None,
    max_records: int,
    max_bytes: int,
    out: bytearray,
    require_record_crc: bool,
) -> GatherResult:
    """Append to ``out`` the records ``entries`` point at in ``buf``, one CommitLog file whose
    first byte is log offset ``base`` and whose first ``written`` bytes readers may see
    (``MappedFile.committed``); records are read below log offset ``readable`` (dispatched) and
    answered below ``visible``. The module docstring says which entries are skipped, where the
    run stops and what it raises."""
    if base < 0 or not 0 <= written <= len(buf):
        raise ValueError(f"a file at log offset {base} with {written} of {len(buf)} bytes written")
    if len(entries) % ENTRY_SIZE:
        raise ValueError(f"{len(entries)} bytes of entries are not whole 20-byte entries")
    if not isinstance(out, bytearray):
        raise TypeError("out must be a bytearray")
    if max_records <= 0:
        return GatherResult(0, 0, 0, RECORD_LIMIT)
    codes = None if tag_codes is None else frozenset(tag_codes)
    tag_set = None if tags is None else frozenset(tags)
    end = base + len(buf)
    limit = min(written, readable - base)
    consumed = records = nbytes = 0
    # No view of ``buf`` outlives a record: retention may close the mapping between two.
    with memoryview(entries) as packed:
        for phy, size, code in ENTRY.iter_unpack(packed):
            if phy == _BLANK_PHY and size == _BLANK_SIZE_FIELD:
                consumed += 1
                continue
            if phy + size > visible:
                return GatherResult(consumed, records, nbytes, NOT_VISIBLE)
            if codes is not None and code not in codes:
                consumed += 1
                continue
            if out and len(out) + size > max_bytes:
                return GatherResult(consumed, records, nbytes, BYTE_LIMIT)
            if not base <= phy < end:
                return GatherResult(consumed, records, nbytes, OTHER_FILE)
            if phy >= readable:
                raise CorruptRecordError(phy, "no record at this offset")
            pos = phy - base
            msg = _read(buf, pos, limit, phy, require_record_crc)
            if isinstance(msg, str):
                raise CorruptRecordError(phy, msg)
            if msg.size != size:
                raise CorruptRecordError(phy, "not a record")
            consumed += 1
            if tag_set is not None and msg.tags not in tag_set:
                continue  # a tag-hash collision
            out += buf[pos : pos + size]
            records += 1
            nbytes += size
            if records >= max_records:
                return GatherResult(consumed, records, nbytes, RECORD_LIMIT)
    return GatherResult(consumed, records, nbytes, ENTRIES_END)
