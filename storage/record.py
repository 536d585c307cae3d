"""CommitLog record codec: RocketMQ's message layout, byte for byte (spec §1.2-1.4).

Every integer is big-endian. With IPv4 hosts and the V1 magic a record is::

    off  size  field
      0     4  TOTALSIZE            whole record, this field included
      4     4  MAGICCODE            V1 0xDAA320A7 | V2 0xDAA320AB (2-byte topic length)
      8     4  BODYCRC              zlib.crc32(body) & 0x7FFFFFFF
     12     4  QUEUEID
     16     4  FLAG
     20     8  QUEUEOFFSET          entry number in the ConsumeQueue
     28     8  PHYSICALOFFSET       global CommitLog offset of this record
     36     4  SYSFLAG              0x10 born host v6, 0x20 store host v6, 0x4/0xC prepared/rollback
     40     8  BORNTIMESTAMP        ms, producer clock
     48     8  BORNHOST             4-byte address + int32 port (IPv6: 16 + 4)
     56     8  STORETIMESTAMP       ms, broker clock
     64     8  STOREHOSTADDRESS     as BORNHOST
     72     4  RECONSUMETIMES
     76     8  PREPARED TRANSACTION OFFSET
     84     4  BODY LENGTH, then the body at 88
      .     1  TOPIC LENGTH (V1; 2 bytes in V2), then the UTF-8 topic
      .     2  PROPERTIES LENGTH (signed), then "name\\x01value\\x02"...

    fixed overhead: 20 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2 = 91 bytes
    (each IPv6 host adds 12)

End of file: when a record plus 8 bytes does not fit in what is left of a file, an 8-byte blank
marker (int32 remaining bytes, int32 0xCBD43194) is written and the record goes to the next file,
so a record never straddles two files.

Offset message id: store address + store port (int32) + PHYSICALOFFSET (int64), as uppercase hex:
32 characters for an IPv4 store host.
"""

from __future__ import annotations

import mmap
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from storage.errors import (
    BodyTooLargeError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidTopicError,
    PropertiesTooLargeError,
)

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
BLANK_SIZE: Final = 8
FIXED_OVERHEAD_V4: Final = 91

SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20
TRANSACTION_MASK: Final = 0xC
TRANSACTION_PREPARED: Final = 0x4
TRANSACTION_ROLLBACK: Final = 0xC

TOPIC_MAX_BYTES: Final = 127
_I32_MIN: Final = -(1 << 31)
_I32_MAX: Final = (1 << 31) - 1
PROPERTIES_MAX_BYTES: Final = 32_767
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_TOPIC_BYTES_RE = re.compile(rb"^[%|a-zA-Z0-9_-]+$")
_known_topics: dict[bytes, str] = {}  # topic bytes already seen valid in a record

Buf = bytes | bytearray | memoryview | mmap.mmap
WBuf = bytearray | memoryview | mmap.mmap

PROP_RECORD_CRC: Final = "__CRC32#"
RECORD_CRC_SIZE: Final = 20  # "__CRC32#" 0x01 ten-digits 0x02
_RECORD_CRC_PREFIX: Final = b"__CRC32#\x01"
_RECORD_CRC_PLACEHOLDER: Final = _RECORD_CRC_PREFIX + b"0" * 10 + b"\x02"

PROP_TAGS: Final = "TAGS"
PROP_KEYS: Final = "KEYS"
PROP_UNIQ_KEY: Final = "UNIQ_KEY"
NAME_SEP: Final = "\x01"
PROP_SEP: Final = "\x02"

# TOTALSIZE .. BORNTIMESTAMP: the part before the first host, identical in every variant.
PREFIX = struct.Struct(">iIiiiqqiq")
BLANK = struct.Struct(">iI")
_HOST = {False: "4si", True: "16si"}


def _header(born_v6: bool, store_v6: bool) -> struct.Struct:
    return struct.Struct(">iIiiiqqiq" + _HOST[born_v6] + "q" + _HOST[store_v6] + "iqi")


# Full header up to and including BODY LENGTH, keyed by (born host v6, store host v6).
HEADERS: Final = {(b, s): _header(b, s) for b in (False, True) for s in (False, True)}
_HEADER_V4: Final = HEADERS[False, False]


def body_crc(body: bytes | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


_valid_topics: dict[str, bytes] = {}
_BAD_PROPERTY_CHARS = re.compile("[\x01\x02]")
_BAD_KEY_CHARS = re.compile("[ \x01\x02]")
_H = struct.Struct(">h")
_I64 = struct.Struct(">q")
_QUEUE_AND_PHY = struct.Struct(">qq")  # QUEUEOFFSET and PHYSICALOFFSET, at byte 20
_STORE_TS_AT = 56  # STORETIMESTAMP with an IPv4 born host
_STORE_TS_AT_V6_BORN = 68


def topic_prefix(topic: str) -> bytes:
    """The topic's length byte and bytes as a record carries them, validated once per topic."""
    prefix = _valid_topics.get(topic)
    if prefix is None:
        encoded = validate_topic(topic)
        prefix = bytes((len(encoded),)) + encoded
        if len(_valid_topics) >= 65_536:
            _valid_topics.clear()
        _valid_topics[topic] = prefix
    return prefix


def validate_topic(topic: str) -> bytes:
    encoded = topic.encode("utf-8")
    if not encoded:
        raise InvalidTopicError("topic is empty")
    if len(encoded) > TOPIC_MAX_BYTES:
        raise InvalidTopicError(f"topic is {len(encoded)} bytes, at most {TOPIC_MAX_BYTES} allowed")
    if not _TOPIC_RE.match(topic):
        raise InvalidTopicError(
            f"topic {topic!r} may hold only letters, digits, '%', '|', '_', '-'"
        )
    return encoded


def encode_properties(props: Mapping[str, str]) -> bytes:
    parts: list[str] = []
    for name, value in props.items():
        if not name or _BAD_PROPERTY_CHARS.search(name) or _BAD_PROPERTY_CHARS.search(value):
            raise InvalidPropertyError(
                f"property {name!r} must be non-empty and free of \\x01 and \\x02"
            )
        parts.append(f"{name}\x01{value}\x02")
    encoded = "".join(parts).encode("utf-8")
    if len(encoded) > PROPERTIES_MAX_BYTES:
        raise PropertiesTooLargeError(
            f"properties are {len(encoded)} bytes, at most {PROPERTIES_MAX_BYTES} allowed"
        )
    return encoded


def decode_properties(raw: bytes) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in raw.decode("utf-8", "replace").split(PROP_SEP):
        name, sep, value = item.partition(NAME_SEP)
        if sep and name != PROP_RECORD_CRC:
            props[name] = value
    return props


def find_property(raw: bytes, name: bytes) -> bytes | None:
    """One property's value straight from the encoded bytes, without building a dict."""
    needle = name + b"\x01"
    if raw.startswith(needle):
        start = len(needle)
    else:
        at = raw.find(b"\x02" + needle)
        if at < 0:
            return None
        start = at + 1 + len(needle)
    end = raw.find(b"\x02", start)
    return raw[start:] if end < 0 else raw[start:end]


@dataclass(slots=True)
class Message:
    """A message as a producer hands it to the store."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0)
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class EncodedMessage:
    """A validated message with everything computed that does not need the append lock."""

    topic: str
    queue_id: int
    # The whole record with zeros where the append fills in TOTALSIZE+MAGICCODE (written last),
    # QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and a missing BORNTIMESTAMP.
    image: bytes
    size: int
    store_ts_at: int
    born_ts_missing: bool
    record_crc: bool
    head: bytes  # TOTALSIZE + MAGICCODE
    head_crc: int  # crc32 of ``head``: where the whole-record CRC starts


def prepare(
    msg: Message,
    max_body_bytes: int,
    store_host: tuple[bytes, int],
    record_crc: bool = False,
) -> EncodedMessage:
    """Validate and pre-encode one message; raises a MessageIllegalError subclass on bad input.

    ``record_crc`` reserves RocketMQ's whole-record CRC property (``enabledAppendPropCRC``):
    20 bytes at the end of the properties, filled in by ``write_record``."""
    prefix = topic_prefix(msg.topic)
    body = msg.body if type(msg.body) is bytes else bytes(msg.body)
    if len(body) > max_body_bytes:
        raise BodyTooLargeError(f"body is {len(body)} bytes, at most {max_body_bytes} allowed")
    if not (
        _I32_MIN <= msg.flag <= _I32_MAX
        and _I32_MIN <= msg.reconsume_times <= _I32_MAX
        and 0 <= msg.born_timestamp_ms < 1 << 63
        and 0 <= msg.prepared_transaction_offset < 1 << 63
        and 0 <= msg.born_host[1] <= 65_535
        and len(msg.born_host[0]) in (4, 16)
    ):
        raise InvalidPropertyError("flag, timestamps, offsets or born host out of range")
    for k in msg.keys:
        if not k or _BAD_KEY_CHARS.search(k):
            raise InvalidPropertyError(f"key {k!r} must be non-empty, free of spaces, \\x01, \\x02")
    keys = " ".join(msg.keys)
    if msg.properties:
        if PROP_RECORD_CRC in msg.properties:
            # The store's own: a reader drops it, and without record CRCs a client's copy
            # ending the properties would be checked as the record CRC and fail it as corrupt.
            raise InvalidPropertyError(f"property {PROP_RECORD_CRC} is reserved")
        props = dict(msg.properties)
        if msg.tags:
            props[PROP_TAGS] = msg.tags
        if keys:
            props[PROP_KEYS] = keys
        props_raw = encode_properties(props)
    else:
        # The common shape (tags and keys only) without building a dict.
        if msg.tags and _BAD_PROPERTY_CHARS.search(msg.tags):
            raise InvalidPropertyError("tags must be free of \\x01 and \\x02")
        text = (f"TAGS\x01{msg.tags}\x02" if msg.tags else "") + (
            f"KEYS\x01{keys}\x02" if keys else ""
        )
        props_raw = text.encode("utf-8")
        if len(props_raw) > PROPERTIES_MAX_BYTES:
            raise PropertiesTooLargeError(
                f"properties are {len(props_raw)} bytes, at most {PROPERTIES_MAX_BYTES} allowed"
            )
    if record_crc:
        if len(props_raw) + RECORD_CRC_SIZE > PROPERTIES_MAX_BYTES:
            raise PropertiesTooLargeError(
                f"properties are {len(props_raw)} bytes; with the record CRC at most "
                f"{PROPERTIES_MAX_BYTES - RECORD_CRC_SIZE} allowed"
            )
        props_raw += _RECORD_CRC_PLACEHOLDER
    born_v6 = len(msg.born_host[0]) == 16
    store_v6 = len(store_host[0]) == 16
    sys_flag = msg.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if born_v6:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if store_v6:
        sys_flag |= SYSFLAG_STOREHOST_V6
    hdr = HEADERS[born_v6, store_v6]
    header = hdr.pack(
        0,
        0,
        zlib.crc32(body) & 0x7FFFFFFF,
        msg.queue_id,
        msg.flag,
        0,
        0,
        sys_flag,
        msg.born_timestamp_ms,
        msg.born_host[0],
        msg.born_host[1],
        0,
        store_host[0],
        store_host[1],
        msg.reconsume_times,
        msg.prepared_transaction_offset,
        len(body),
    )
    image = b"".join((header, body, prefix, _H.pack(len(props_raw)), props_raw))
    size = len(image)
    head = BLANK.pack(size, MAGIC_V1)
    return EncodedMessage(
        msg.topic,
        msg.queue_id,
        image,
        size,
        _STORE_TS_AT_V6_BORN if born_v6 else _STORE_TS_AT,
        not msg.born_timestamp_ms,
        record_crc,
        head,
        zlib.crc32(head),
    )


def _record_crc_digits(crc: int) -> bytes:
    """RocketMQ's MessageDecoder.createCrc32: ten ASCII digits, least significant first."""
    return str(crc)[::-1].ljust(10, "0").encode()


def write_record(
    buf: WBuf,
    pos: int,
    m: EncodedMessage,
    queue_offset: int,
    phy_offset: int,
    store_timestamp_ms: int,
) -> None:
    """Write one prepared record at ``pos`` of a writable buffer (an mmap, or a memoryview of
    one: the whole-record CRC is then computed without copying).

    TOTALSIZE and MAGICCODE go in last, in one 8-byte store: until then the position reads as
    zeros (the end of the data), so a writer killed half-way never leaves a record that looks whole.
    """
    end = pos + m.size
    buf[pos:end] = m.image
    _QUEUE_AND_PHY.pack_into(buf, pos + 20, queue_offset, phy_offset)
    if m.born_ts_missing:
        _I64.pack_into(buf, pos + 40, store_timestamp_ms)
    _I64.pack_into(buf, pos + m.store_ts_at, store_timestamp_ms)
    if m.record_crc:
        crc = zlib.crc32(buf[pos + BLANK_SIZE : end - RECORD_CRC_SIZE], m.head_crc)
        buf[end - 11 : end - 1] = _record_crc_digits(crc & 0x7FFFFFFF)
    buf[pos : pos + BLANK_SIZE] = m.head


def write_blank(buf: WBuf, pos: int, remaining: int) -> None:
    BLANK.pack_into(buf, pos, remaining, BLANK_MAGIC)


def encode_record(
    msg: Message,
    queue_offset: int,
    phy_offset: int,
    store_timestamp_ms: int,
    store_host: tuple[bytes, int],
    max_body_bytes: int = 4 << 20,
    record_crc: bool = False,
) -> bytes:
    """One whole record as bytes (tests, tools); the store writes straight into its mmap instead."""
    m = prepare(msg, max_body_bytes, store_host, record_crc)
    buf = bytearray(m.size)
    with memoryview(buf) as view:
        write_record(view, 0, m, queue_offset, phy_offset, store_timestamp_ms)
    return bytes(buf)


class StoredMessage(NamedTuple):
    """A record decoded for a reader. A NamedTuple, not a frozen dataclass: readers build one
    per message, and a frozen dataclass costs four times as much to construct."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    body: bytes
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[bytes, int]
    store_timestamp_ms: int
    store_host: tuple[bytes, int]
    reconsume_times: int
    prepared_transaction_offset: int
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROP_KEYS, "").split(" ") if k]

    @property
    def msg_id(self) -> str:
        return make_msg_id(self.store_host, self.phy_offset)


# Outcomes of checking the bytes at one position (spec §1.4).
OK: Final = 0
END_OF_FILE: Final = 1
INCOMPLETE: Final = 2  # fewer bytes than the record claims: a torn or still-arriving tail
CORRUPT: Final = 3


@dataclass(slots=True)
class RecordInfo:
    """What dispatch and recovery need from one record, read without decoding the body."""

    size: int
    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    sys_flag: int
    store_timestamp_ms: int
    tags: bytes | None
    keys: bytes | None
    uniq_key: bytes | None


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
    size, magic = BLANK.unpack_from(buf, pos)
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
        topic_len = _H.unpack_from(buf, topic_len_at)[0]
        topic_at = topic_len_at + 2
    else:
        topic_len = buf[topic_len_at]
        topic_at = topic_len_at + 1
    props_len_at = topic_at + topic_len
    if props_len_at + 2 > end:
        return CORRUPT, "topic length runs past the record"
    props_len = _H.unpack_from(buf, props_len_at)[0]
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
    The whole-record CRC covers every byte but its own 20, body and BODYCRC included, so when it
    holds the body CRC adds nothing and is not computed again."""
    fields, body_at, _, _, props_len, end = layout
    with memoryview(buf) as mv:
        if props_len >= RECORD_CRC_SIZE and (
            mv[end - RECORD_CRC_SIZE : end - 11].tobytes() == _RECORD_CRC_PREFIX
        ):
            stored = bytes(mv[end - 11 : end - 1])
            whole = zlib.crc32(mv[pos : end - RECORD_CRC_SIZE]) & 0x7FFFFFFF
            if stored != _record_crc_digits(whole) or mv[end - 1] != 0x02:
                return "record CRC mismatch"
            return None
        if require:
            return "record CRC property missing"
        if body_crc(mv[body_at : body_at + fields[16]]) != fields[2]:
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
    return OK, RecordInfo(
        end - pos, topic, fields[3], fields[5], fields[6], fields[7], fields[11], tags, keys, uniq
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
    magic, sys_flag = PREFIX.unpack_from(buf, pos)[1::6]
    hdr = HEADERS[bool(sys_flag & SYSFLAG_BORNHOST_V6), bool(sys_flag & SYSFLAG_STOREHOST_V6)]
    fields = hdr.unpack_from(buf, pos)
    body_at = pos + hdr.size
    at = body_at + fields[16]
    body = bytes(buf[body_at:at])
    if magic == MAGIC_V2:
        (topic_len,) = _H.unpack_from(buf, at)
        at += 2
    else:
        topic_len = buf[at]
        at += 1
    topic = bytes(buf[at : at + topic_len]).decode("utf-8", "replace")
    at += topic_len
    (props_len,) = _H.unpack_from(buf, at)
    props = decode_properties(bytes(buf[at + 2 : at + 2 + props_len])) if props_len else {}
    return _stored(fields, topic, fields[0], body, props)


def make_msg_id(store_host: tuple[bytes, int], phy_offset: int) -> str:
    return (store_host[0] + struct.pack(">iq", store_host[1], phy_offset)).hex().upper()


def parse_msg_id(msg_id: str) -> tuple[tuple[bytes, int], int]:
    """Offset message id -> ((store address, port), physical offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise InvalidMessageIdError(f"message id {msg_id!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise InvalidMessageIdError(
            f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters"
        )
    addr_len = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, addr_len)
    if not 0 <= port <= 65_535 or offset < 0:
        # make_msg_id never writes these: the id was forged or damaged, not merely stale.
        raise InvalidMessageIdError(f"message id {msg_id!r} holds port {port}, offset {offset}")
    return (raw[:addr_len], port), offset
