"""Records by the block: the per-record loops of the store, each one call per span.

``fill_block`` is the broker's side of a send by the block: a producer encoded one topic's, one
queue's messages as CommitLog records (``layout``) with the fields only the broker knows left
zero; ``fill_block`` checks every record and lays the block out as stored records, placed from a
log offset on, with blank markers where a record does not fit what is left of a file. What it adds
to every record: the body CRC, queue and physical offsets, SYSFLAG's host bits, the born host (the
producer's address as the broker sees it), store timestamp and host, and, with ``record_crc``, the
record CRC property. The head of an idempotent run also gets the run's stamp property, and the
other records the run-member SYSFLAG bit. The stored records go into the caller's buffer
(``out``), so the broker copies each record once on its way to the file: every record is checked
before the first byte of ``out`` is written, and a refused block leaves ``out`` as it was.

The block as sent (every integer big-endian; the sent record is the stored one with IPv4 hosts)::

    TOTALSIZE        the record's size as sent
    MAGICCODE        V1 (0xDAA320A7)
    BODYCRC          0
    QUEUEID          the block's queue
    FLAG             any int32
    QUEUEOFFSET      0
    PHYSICALOFFSET   0
    SYSFLAG          0
    BORNTIMESTAMP    >= 0 (0: the store timestamp)
    BORNHOST         8 zero bytes
    STORETIMESTAMP   0
    STOREHOSTADDRESS 8 zero bytes
    RECONSUMETIMES   0
    PREPARED TX OFF  0
    BODY LENGTH      then the body, at most max_body_bytes
    TOPIC LENGTH     1 byte, then the topic: the block's
    PROPERTIES LEN   int16, then ``name 0x01 value 0x02`` pairs, valid UTF-8, none of the
                     store's own names (``RESERVED_PROPERTIES``)

``scan_span`` is dispatch's walk: the whole records of a span of one CommitLog file, each checked
(shape, position and, past ``verify_from``, its CRCs) as ``decode.check_record`` checks one,
answered as what dispatch writes: per queue, runs of packed 20-byte ConsumeQueue entries at
consecutive queue offsets, and the records the index needs. ``gather_records`` (``gather``) is
a pull's: the checked record bytes behind a run of ConsumeQueue entries.

Each has a compiled twin in ``_cblock`` (C, the CPython API; ``_cblock.c`` says how it is
built), chosen once at import unless ``TIDEMQ_PURE_PYTHON=1`` or the extension is not built
(``IMPLEMENTATION`` says which runs). The twins take the same arguments and give the same
answers, bytes and errors (``tests/unit/test_record_codec_twins.py`` runs both against golden
bytes and against each other on random and corrupted input).
"""

from __future__ import annotations

import os
import struct
from types import ModuleType
from typing import Final, NamedTuple

from tidemq.storage.crc import crc32
from tidemq.storage.errors import (
    BodyTooLargeError,
    CorruptRecordError,
    InvalidPropertyError,
    MessageIllegalError,
    PropertiesTooLargeError,
)
from tidemq.storage.record.decode import check_record
from tidemq.storage.record.gather import GatherResult, py_gather_records
from tidemq.storage.record.layout import (
    CORRUPT,
    CRC_DIGITS,
    CRC_MASK,
    FIXED_OVERHEAD_V4,
    HEADER_V4,
    HEADERS,
    I16,
    MAGIC_V1,
    OK,
    PROPERTIES_MAX_BYTES,
    RECORD_CRC_NAME,
    RECORD_CRC_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    Buf,
    WBuf,
)
from tidemq.storage.record.messages import RecordInfo

# Property names only the store writes: the record CRCs and the idempotence stamp.
RESERVED_PROPERTIES: Final = (b"__CRC32H", b"__CRC32#", b"PRODUCER_SEQ")
RESERVED_NAMES: Final = tuple(name.decode() for name in RESERVED_PROPERTIES)
ENTRY: Final = struct.Struct(">qiq")  # a ConsumeQueue entry: phy offset, size, tag code
_BLANK_SIZE: Final = 8  # the blank marker that ends a file (layout.BLANK)
_I32_LIMIT: Final = 1 << 31
_OFFSET_LIMIT: Final = 1 << 62


class CorruptBlockError(MessageIllegalError):
    """A sent block whose bytes are not records as the block format says (not retriable: the
    same bytes fail again). Nothing of the request is stored."""

    code = "CORRUPT_BLOCK"


class FilledBlock(NamedTuple):
    """A block laid out for its place in the log and copied into ``out``, not yet written to any
    file."""

    # (log offset, out offset, length, fills_file) in log order, each inside one file: whole
    # records, copied to out[out offset : out offset + length], to be written at the log offset;
    # or (fills_file, length 0) the place of a blank marker that ends its file.
    spans: list[tuple[int, int, int, bool]]
    end: int  # the log's end after the block
    first_phy_offset: int
    last_phy_offset: int
    last_size: int
    added_bytes: int  # stored size - sent size, for every record but the head's stamp
    head_added_bytes: int  # the head's stamp
    file_starts: list[tuple[int, int]]  # (record index, offset) of records that begin a file
    body_bytes: int  # of every record's body (what the broker's send metrics count)


class SpanScan(NamedTuple):
    """What ``scan_span`` found in [pos, limit) of one file."""

    scanned: int  # whole records scanned
    end: int  # position after them (or of the blank marker, INCOMPLETE or CORRUPT record)
    status: int  # OK: reached limit or max_records; END_OF_FILE at ``end``; INCOMPLETE; CORRUPT
    reason: str | None
    # (topic, queue id, first queue offset, packed entries): entries at consecutive queue
    # offsets, a queue's runs in log order. Prepared and rolled-back halves have none.
    runs: list[tuple[str, int, int, bytes]]
    keyed: list[tuple[str, int, int, list[bytes]]]  # (topic, phy offset, store ms, keys)
    last_store_timestamp_ms: int  # of the last record scanned (0: none)


def filled_size_bound(
    n_bytes: int, count: int, born_v6: bool, store_v6: bool, record_crc: bool, head_len: int
) -> int:
    """The most ``out`` bytes ``fill_block`` can need for a sent block of ``n_bytes`` holding
    ``count`` records (a block it would accept; it refuses the others before writing): each
    record grows by 12 bytes per IPv6 host and 20 with the record CRC, the head by its stamp.
    A record is at least 91 bytes, so a wrong ``count`` cannot ask for more than that allows."""
    per_record = 12 * born_v6 + 12 * store_v6 + (RECORD_CRC_SIZE if record_crc else 0)
    return n_bytes + min(max(count, 0), n_bytes // FIXED_OVERHEAD_V4) * per_record + head_len


def _refuse(index: int, reason: str) -> CorruptBlockError:
    return CorruptBlockError(f"record {index} of the block: {reason}")


def _check_properties(index: int, props: bytes) -> None:
    """Well-formed ``name 0x01 value 0x02`` pairs in valid UTF-8, none of the store's names."""
    if not props:
        return
    if props[-1] != 0x02:
        raise InvalidPropertyError(f"record {index} of the block: properties must end with 0x02")
    for item in props[:-1].split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if not sep or not name or b"\x01" in value:
            raise InvalidPropertyError(
                f"record {index} of the block: properties must be name 0x01 value 0x02 pairs"
            )
        if name in RESERVED_PROPERTIES:
            raise InvalidPropertyError(
                f"record {index} of the block: property {name.decode()} is the store's"
            )
    try:
        props.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidPropertyError(
            f"record {index} of the block: properties are not valid UTF-8"
        ) from None


def _host(host: tuple[bytes, int], which: str) -> tuple[bytes, int]:
    addr, port = host
    if len(addr) not in (4, 16) or not 0 <= port <= 65_535:
        raise ValueError(f"the {which} host must be a 4 or 16-byte address and a port")
    return addr, port


def py_fill_block(
    records: Buf,
    count: int,
    topic: str,
    queue_id: int,
    start: int,
    file_size: int,
    first_queue_offset: int,
    now_ms: int,
    born_host: tuple[bytes, int],
    store_host: tuple[bytes, int],
    max_body_bytes: int,
    record_crc: bool,
    out: WBuf,
    out_pos: int,
    head_property: bytes = b"",
    member_sys_flag: int = 0,
) -> FilledBlock:
    """Check the sent block ``records`` (``count`` records of ``topic``/``queue_id``) and lay it
    out as stored records from log offset ``start`` on (the ``file_size``-byte file that holds
    ``start`` first), copied into ``out`` from ``out_pos`` on (``filled_size_bound`` says how
    much room that takes at most). Record i gets queue offset ``first_queue_offset + i``.
    ``head_property`` (encoded ``name 0x01 value 0x02``) is appended to the first record's
    properties and ``member_sys_flag`` set in the others' SYSFLAG. Raises
    ``CorruptBlockError``, ``InvalidPropertyError``, ``PropertiesTooLargeError`` or
    ``BodyTooLargeError`` naming the first bad record, and ValueError when ``out`` has too little
    room; either way nothing is written to ``out``."""
    born_addr, born_port = _host(born_host, "born")
    store_addr, store_port = _host(store_host, "store")
    # Below 2**62, log offsets and queue offsets cannot overflow however many records come.
    if not (
        0 < file_size < _OFFSET_LIMIT
        and 0 <= start < _OFFSET_LIMIT
        and 0 <= first_queue_offset < _OFFSET_LIMIT
        and out_pos >= 0
        and now_ms >= 0
    ):
        raise ValueError("file_size, start, first_queue_offset, out_pos or now_ms out of range")
    if not 0 <= member_sys_flag < _I32_LIMIT:
        raise ValueError("member_sys_flag must be a non-negative int32")
    try:
        view = memoryview(out)
    except TypeError:
        raise TypeError("out must be a writable buffer") from None
    with view:
        if view.readonly:
            raise TypeError("out must be a writable buffer")
        if count <= 0:
            raise CorruptBlockError("a block holds at least one record")
        if type(records) is not bytes:
            records = bytes(records)
        parts, filled = _lay_out(
            records, count, topic, queue_id, start, file_size, first_queue_offset, now_ms,
            born_addr, born_port, store_addr, store_port, max_body_bytes, record_crc, out_pos,
            head_property, member_sys_flag,
        )  # fmt: skip
        total = sum(map(len, parts))
        if out_pos + total > view.nbytes:
            raise ValueError(
                f"out holds {view.nbytes} bytes; the block needs {total} from out_pos {out_pos}"
            )
        view[out_pos : out_pos + total] = b"".join(parts)
    return filled


def _lay_out(
    records: bytes,
    count: int,
    topic: str,
    queue_id: int,
    start: int,
    file_size: int,
    first_queue_offset: int,
    now_ms: int,
    born_addr: bytes,
    born_port: int,
    store_addr: bytes,
    store_port: int,
    max_body_bytes: int,
    record_crc: bool,
    out_pos: int,
    head_property: bytes,
    member_sys_flag: int,
) -> tuple[list[bytes], FilledBlock]:
    """``py_fill_block``'s loop: every record checked and encoded, nothing written yet."""
    born_v6 = len(born_addr) == 16
    store_v6 = len(store_addr) == 16
    hdr = HEADERS[born_v6, store_v6]
    host_flags = (SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    added = hdr.size - HEADER_V4.size + (RECORD_CRC_SIZE if record_crc else 0)
    topic_raw = topic.encode("utf-8")
    n = len(records)
    spans: list[tuple[int, int, int, bool]] = []
    parts: list[bytes] = []
    file_starts: list[tuple[int, int]] = []
    pos = span_start = start
    out_at = span_out = out_pos
    file_end = start - start % file_size + file_size
    at = 0
    last_pos = last_size = 0
    body_bytes = 0
    head = b""
    for i in range(count):
        if n - at < FIXED_OVERHEAD_V4:
            raise _refuse(i, f"{n - at} bytes left where a record of at least 91 should start")
        f = HEADER_V4.unpack_from(records, at)
        size, magic = f[0], f[1]
        if size < FIXED_OVERHEAD_V4 or size > n - at:
            raise _refuse(i, f"size {size} does not fit the {n - at} bytes left")
        if magic != MAGIC_V1:
            raise _refuse(i, f"magic 0x{magic:08X} is not V1")
        if f[3] != queue_id:
            raise _refuse(i, f"queue id {f[3]} in a block of queue {queue_id}")
        if (
            any(f[k] for k in (2, 5, 6, 7, 10, 11, 13, 14, 15))
            or f[9] != b"\0\0\0\0"
            or f[12] != b"\0\0\0\0"
        ):
            raise _refuse(i, "a field the broker fills is not zero")
        if f[8] < 0:
            raise _refuse(i, "the born timestamp is negative")
        body_len = f[16]
        body_bytes += body_len
        body_at = at + HEADER_V4.size
        topic_len_at = body_at + body_len
        if body_len < 0 or topic_len_at + 3 > at + size:
            raise _refuse(i, "body length runs past the record")
        if body_len > max_body_bytes:
            raise BodyTooLargeError(
                f"record {i} of the block: body is {body_len} bytes, at most {max_body_bytes} "
                f"allowed"
            )
        topic_len = records[topic_len_at]
        props_len_at = topic_len_at + 1 + topic_len
        if props_len_at + 2 > at + size:
            raise _refuse(i, "topic length runs past the record")
        if records[topic_len_at + 1 : props_len_at] != topic_raw:
            raise _refuse(i, f"its topic is not the block's ({topic})")
        props_len = I16.unpack_from(records, props_len_at)[0]
        if props_len < 0 or props_len_at + 2 + props_len != at + size:
            raise _refuse(i, "record length does not match its fields")
        props = records[props_len_at + 2 : at + size]
        _check_properties(i, props)
        head = head_property if i == 0 else b""
        new_props_len = props_len + len(head) + (RECORD_CRC_SIZE if record_crc else 0)
        if new_props_len > PROPERTIES_MAX_BYTES:
            raise PropertiesTooLargeError(
                f"record {i} of the block: properties are {props_len} bytes, at most "
                f"{PROPERTIES_MAX_BYTES - new_props_len + props_len} allowed"
            )
        stored_size = size + added + len(head)
        if pos + stored_size + _BLANK_SIZE > file_end:
            if stored_size + _BLANK_SIZE > file_size:
                raise BodyTooLargeError(
                    f"record {i} of the block: {stored_size} bytes cannot fit a CommitLog file "
                    f"of {file_size} bytes"
                )
            if out_at > span_out:
                spans.append((span_start, span_out, out_at - span_out, False))
            spans.append((pos, out_at, 0, True))
            pos = span_start = file_end
            span_out = out_at
            file_end += file_size
            file_starts.append((i, pos))
        body = records[body_at:topic_len_at]
        suffix = b"".join(
            (
                records[topic_len_at:props_len_at],
                I16.pack(new_props_len),
                props,
                head,
                RECORD_CRC_NAME if record_crc else b"",
            )
        )
        header = hdr.pack(
            stored_size, MAGIC_V1, crc32(body) & CRC_MASK, queue_id, f[4],
            first_queue_offset + i, pos, host_flags | (member_sys_flag if i else 0),
            f[8] or now_ms, born_addr, born_port, now_ms, store_addr, store_port, 0, 0, body_len,
        )  # fmt: skip
        parts += (header, body, suffix)
        if record_crc:
            parts.append(CRC_DIGITS % (crc32(header, crc32(suffix)) & CRC_MASK))
        last_pos, last_size = pos, stored_size
        pos += stored_size
        out_at += stored_size
        at += size
    if at != n:
        raise CorruptBlockError(f"the block holds {n - at} bytes after its {count} records")
    if out_at > span_out:
        spans.append((span_start, span_out, out_at - span_out, False))
    first = file_starts[0][1] if file_starts and file_starts[0][0] == 0 else start
    filled = FilledBlock(
        spans, pos, first, last_pos, last_size, added, len(head_property), file_starts,
        body_bytes,
    )  # fmt: skip
    return parts, filled


def _check(
    buf: Buf, pos: int, limit: int, verify: bool, at: int, require_record_crc: bool
) -> tuple[int, RecordInfo | str | None]:
    """``check_record``, except that a header or length field found past the end of ``buf``
    (which ``check_record`` meets as struct.error) is the answer a longer buffer would give:
    such a record claims fewer bytes than its fields need."""
    try:
        return check_record(buf, pos, limit, verify, at, require_record_crc)
    except struct.error:
        return CORRUPT, "body length runs past the record"


def py_scan_span(
    buf: Buf,
    pos: int,
    limit: int,
    base: int,
    verify_from: int,
    require_record_crc: bool,
    max_records: int,
) -> SpanScan:
    """Walk the whole records of ``buf`` (one CommitLog file, whose first byte is log offset
    ``base``) from ``pos`` to ``limit``, at most ``max_records`` of them (0: no limit),
    checking each as ``check_record`` does, CRCs from log offset ``verify_from`` on; see
    ``SpanScan`` for the answer."""
    if pos < 0 or limit > len(buf):
        raise ValueError(f"span [{pos}, {limit}) outside a buffer of {len(buf)} bytes")
    runs: list[tuple[str, int, int, bytes]] = []
    # (topic, queue id) -> (first queue offset, packed entries, next queue offset)
    open_runs: dict[tuple[str, int], tuple[int, bytearray, int]] = {}
    keyed: list[tuple[str, int, int, list[bytes]]] = []
    count = 0
    last_ms = 0
    status: int = OK
    reason: str | None = None
    pack = ENTRY.pack
    while pos < limit:
        if max_records and count >= max_records:
            break
        at = base + pos
        st, info = _check(buf, pos, limit, at >= verify_from, at, require_record_crc)
        if st != OK:
            status, reason = st, (info if isinstance(info, str) else None)
            break
        assert isinstance(info, RecordInfo)
        tx = info.sys_flag & TRANSACTION_MASK
        if tx not in (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK):
            key = (info.topic, info.queue_id)
            entry = pack(info.phy_offset, info.size, info.entry_tag_code())
            run = open_runs.get(key)
            if run is not None and run[2] == info.queue_offset:
                run[1].extend(entry)
                open_runs[key] = (run[0], run[1], info.queue_offset + 1)
            else:
                if run is not None:
                    runs.append((key[0], key[1], run[0], bytes(run[1])))
                open_runs[key] = (info.queue_offset, bytearray(entry), info.queue_offset + 1)
        if tx != TRANSACTION_ROLLBACK and (info.keys or info.uniq_key):
            keys = [info.uniq_key] if info.uniq_key else []
            if info.keys:
                keys += info.keys.split(b" ")
            keyed.append((info.topic, info.phy_offset, info.store_timestamp_ms, keys))
        last_ms = info.store_timestamp_ms
        count += 1
        pos += info.size
    for (topic, qid), run in open_runs.items():
        runs.append((topic, qid, run[0], bytes(run[1])))
    return SpanScan(count, pos, status, reason, runs, keyed, last_ms)


# ------------------------------------------------------------------ the implementation in use
fill_block = py_fill_block
scan_span = py_scan_span
gather_records = py_gather_records
IMPLEMENTATION = "python"


def hand_over(compiled: ModuleType) -> None:
    """Give the compiled module the classes it raises and answers with, so that it raises and
    answers exactly what the twins do (at import; the tests call it too, to run both twins
    where ``TIDEMQ_PURE_PYTHON=1`` chose Python)."""
    compiled.setup(
        CorruptBlockError,
        InvalidPropertyError,
        PropertiesTooLargeError,
        BodyTooLargeError,
        CorruptRecordError,
        FilledBlock,
        SpanScan,
        GatherResult,
    )


def _load_compiled() -> bool:
    if os.environ.get("TIDEMQ_PURE_PYTHON") == "1":
        return False
    try:
        from tidemq.storage.record import _cblock  # noqa: PLC0415 (optional, built by setup.py)
    except ImportError:
        return False
    hand_over(_cblock)
    global fill_block, scan_span, gather_records, IMPLEMENTATION
    fill_block = _cblock.fill_block
    scan_span = _cblock.scan_span
    gather_records = _cblock.gather_records
    IMPLEMENTATION = "c"
    return True


_load_compiled()
