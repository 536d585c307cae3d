"""Decoding and checking records: whether the bytes at a position are a whole, valid record (its
shape, its position and its CRCs; see ``layout``), what dispatch and recovery need from it, and
the whole message for a reader."""

from __future__ import annotations

from typing import Any

from tidemq.storage.crc import crc32
from tidemq.storage.record.layout import (
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE,
    CORRUPT,
    CRC_DIGITS,
    CRC_MASK,
    END_OF_FILE,
    FIXED_OVERHEAD_V4,
    HEADER_V4,
    HEADERS,
    I16,
    INCOMPLETE,
    LEGACY_RECORD_CRC_NAME,
    MAGIC_V1,
    MAGIC_V2,
    OK,
    PREFIX,
    RECORD_CRC_NAME,
    RECORD_CRC_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    TOPIC_BYTES_RE,
    Buf,
)
from tidemq.storage.record.messages import RecordInfo, StoredMessage
from tidemq.storage.record.properties import (
    PROP_TIMER_DELIVER_MS,
    TIMER_TOPIC,
    decode_properties,
    find_property,
    parse_timer_deliver_ms,
)

# Names bound here rather than by the import, for what runs per record: CPython 3.11 compiles
# ``NAME.method(...)`` as a method call, except on a name an import bound, which it takes for a
# module and compiles as an attribute load that builds a bound method on every call.
_BLANK = BLANK
_HEADER_V4 = HEADER_V4
_I16 = I16
_PREFIX = PREFIX
_TOPIC_BYTES_RE = TOPIC_BYTES_RE
_TIMER_PROP = PROP_TIMER_DELIVER_MS.encode()

_known_topics: dict[bytes, str] = {}  # topic bytes already seen valid in a record

# What _layout found: the header's fields (the IPv4 tuple order, hosts as their full bytes),
# then where the body, topic and properties sit and where the record ends.
_Layout = tuple[tuple[Any, ...], int, int, int, int, int]


def _layout(
    buf: Buf, pos: int, limit: int, expect_phy_offset: int
) -> tuple[int, str | None] | _Layout:
    """The shape checks every reader of a record makes: (status, reason) when the bytes at
    ``pos`` are no whole record, else (fields, body_at, topic_at, props_len_at, props_len, end).
    """
    avail = limit - pos
    if avail < BLANK_SIZE:
        return INCOMPLETE, f"only {avail} bytes left"
    size, magic = _BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return END_OF_FILE, None
    if magic not in (MAGIC_V1, MAGIC_V2):
        if size == 0 and magic == 0:
            return INCOMPLETE, "zeros where a record should start"
        return CORRUPT, f"bad magic 0x{magic:08X}"
    if size < FIXED_OVERHEAD_V4:
        return CORRUPT, f"record size {size} below the minimum"
    if size > avail:
        return INCOMPLETE, f"record of {size} bytes but only {avail} available"
    # Read the header as the common IPv4 layout; re-read it when SYSFLAG says otherwise.
    fields = _HEADER_V4.unpack_from(buf, pos)
    sys_flag = fields[7]
    hdr = _HEADER_V4
    if sys_flag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6):
        hdr = HEADERS[bool(sys_flag & SYSFLAG_BORNHOST_V6), bool(sys_flag & SYSFLAG_STOREHOST_V6)]
        fields = hdr.unpack_from(buf, pos)
    body_len = fields[16]
    end = pos + size
    body_at = pos + hdr.size
    topic_len_at = body_at + body_len
    v2 = magic == MAGIC_V2
    if body_len < 0 or topic_len_at + (2 if v2 else 1) + 2 > end:
        return CORRUPT, "body length runs past the record"
    if v2:
        topic_len = _I16.unpack_from(buf, topic_len_at)[0]
        topic_at = topic_len_at + 2
    else:
        topic_len = buf[topic_len_at]
        topic_at = topic_len_at + 1
    props_len_at = topic_at + topic_len
    if props_len_at + 2 > end:
        return CORRUPT, "topic length runs past the record"
    props_len = _I16.unpack_from(buf, props_len_at)[0]
    if props_len < 0 or props_len_at + 2 + props_len != end:
        return CORRUPT, "record length does not match its fields"
    if fields[6] != expect_phy_offset:
        return CORRUPT, f"PHYSICALOFFSET {fields[6]} where {expect_phy_offset} was expected"
    # Cheap shape checks that catch a torn topic or properties even without the record CRC.
    if props_len and buf[end - 1] != 0x02:
        return CORRUPT, "properties do not end with a separator"
    return fields, body_at, topic_at, props_len_at, props_len, end


def _topic_of(buf: Buf, topic_at: int, props_len_at: int) -> str | None:
    topic_raw = bytes(buf[topic_at:props_len_at])
    topic = _known_topics.get(topic_raw)
    if topic is None:
        if not topic_raw or not _TOPIC_BYTES_RE.match(topic_raw):
            return None
        topic = topic_raw.decode("ascii")
        if len(_known_topics) >= 65_536:
            _known_topics.clear()
        _known_topics[topic_raw] = topic
    return topic


def _crc_problem(buf: Buf, pos: int, layout: _Layout, require: bool) -> str | None:
    """Why the CRCs of the record at ``pos`` fail, or None (``layout`` as _layout found it).
    tidemq's record CRC covers everything but the body and its own ten digits; the body CRC,
    inside the header it covers, vouches for the body. RocketMQ's legacy whole-record CRC covers
    the body too, so when a record carries that one the body CRC adds nothing."""
    fields, body_at, _, _, props_len, end = layout
    body_end = body_at + fields[16]
    with memoryview(buf) as mv:
        name = b""
        if props_len >= RECORD_CRC_SIZE:
            name = mv[end - RECORD_CRC_SIZE : end - 11].tobytes()
        if name == RECORD_CRC_NAME:
            crc = crc32(mv[pos:body_at], crc32(mv[body_end : end - 11])) & CRC_MASK
            if mv[end - 11 : end].tobytes() != CRC_DIGITS % crc:
                return "record CRC mismatch"
        elif name == LEGACY_RECORD_CRC_NAME:
            crc = crc32(mv[pos : end - RECORD_CRC_SIZE]) & CRC_MASK
            if mv[end - 11 : end].tobytes() != str(crc)[::-1].ljust(10, "0").encode() + b"\x02":
                return "record CRC mismatch"
            return None
        elif require:
            return "record CRC property missing"
        if crc32(mv[body_at:body_end]) & CRC_MASK != fields[2]:
            return "body CRC mismatch"
    return None


def check_record(
    buf: Buf,
    pos: int,
    limit: int,
    verify_crc: bool,
    expect_phy_offset: int,
    require_record_crc: bool = False,
) -> tuple[int, RecordInfo | str | None]:
    """Check the record at ``pos`` of ``buf`` (readable up to ``limit``).

    Returns (OK, RecordInfo), (END_OF_FILE, None), (INCOMPLETE, reason) or (CORRUPT, reason).
    With ``require_record_crc`` a record without the whole-record CRC property is corrupt: in a
    store that writes it, its absence means the marker itself was damaged.
    Beyond RocketMQ's checks, PHYSICALOFFSET must equal ``expect_phy_offset``: a stale but
    well-formed record left behind a shorter new tail is then not mistaken for a live one.
    """
    found = _layout(buf, pos, limit, expect_phy_offset)
    if len(found) == 2:
        return found
    fields, _, topic_at, props_len_at, props_len, end = found
    topic = _topic_of(buf, topic_at, props_len_at)
    if topic is None:
        return CORRUPT, "topic is empty or holds bytes no topic may hold"
    if verify_crc:
        problem = _crc_problem(buf, pos, found, require_record_crc)
        if problem is not None:
            return CORRUPT, problem
    tags = keys = uniq = None
    if props_len:
        for item in bytes(buf[props_len_at + 2 : end]).split(b"\x02"):
            name, _, value = item.partition(b"\x01")
            if name == b"TAGS":
                tags = value
            elif name == b"KEYS":
                keys = value
            elif name == b"UNIQ_KEY":
                uniq = value
    deliver_ms = None
    if topic == TIMER_TOPIC and props_len:
        raw = bytes(buf[props_len_at + 2 : end])
        deliver_ms = parse_timer_deliver_ms(find_property(raw, _TIMER_PROP))
    return OK, RecordInfo(
        end - pos,
        topic,
        fields[3],
        fields[5],
        fields[6],
        fields[7],
        fields[11],
        tags,
        keys,
        uniq,
        deliver_ms,
    )


def read_record(
    buf: Buf, pos: int, limit: int, expect_phy_offset: int, require_record_crc: bool
) -> StoredMessage | str:
    """The record at ``pos`` decoded for a reader, after every check ``check_record`` makes with
    CRCs on, in one pass; a string says why there is no valid record there."""
    found = _layout(buf, pos, limit, expect_phy_offset)
    if len(found) == 2:
        return str(found[1] or "a blank marker, not a record")
    fields, body_at, topic_at, props_len_at, props_len, end = found
    topic = _topic_of(buf, topic_at, props_len_at)
    if topic is None:
        return "topic is empty or holds bytes no topic may hold"
    problem = _crc_problem(buf, pos, found, require_record_crc)
    if problem is not None:
        return problem
    body = bytes(buf[body_at : body_at + fields[16]])
    props = decode_properties(bytes(buf[props_len_at + 2 : end])) if props_len else {}
    return _stored(fields, topic, end - pos, body, props)


def _stored(
    f: tuple[Any, ...], topic: str, size: int, body: bytes, props: dict[str, str]
) -> StoredMessage:
    # f is a header tuple in the IPv4 field order (see _layout); hosts keep their full bytes.
    return StoredMessage(
        topic, f[3], f[5], f[6], size, body, f[2], f[4], f[7], f[8], (f[9], f[10]), f[11],
        (f[12], f[13]), f[14], f[15], props,
    )  # fmt: skip


def decode_record(buf: Buf, pos: int = 0) -> StoredMessage:
    """Decode a record already known to be whole (see check_record)."""
    magic, sys_flag = _PREFIX.unpack_from(buf, pos)[1::6]
    hdr = HEADERS[bool(sys_flag & SYSFLAG_BORNHOST_V6), bool(sys_flag & SYSFLAG_STOREHOST_V6)]
    fields = hdr.unpack_from(buf, pos)
    body_at = pos + hdr.size
    at = body_at + fields[16]
    body = bytes(buf[body_at:at])
    if magic == MAGIC_V2:
        (topic_len,) = _I16.unpack_from(buf, at)
        at += 2
    else:
        topic_len = buf[at]
        at += 1
    topic = bytes(buf[at : at + topic_len]).decode("utf-8", "replace")
    at += topic_len
    (props_len,) = _I16.unpack_from(buf, at)
    props = decode_properties(bytes(buf[at + 2 : at + 2 + props_len])) if props_len else {}
    return _stored(fields, topic, fields[0], body, props)
