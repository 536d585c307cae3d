"""CommitLog record codec: RocketMQ's message layout, byte for byte (spec §1.2-1.4).

Every integer is big-endian. With IPv4 hosts and the V1 magic a record is::

    off  size  field
      0     4  TOTALSIZE            whole record, this field included
      4     4  MAGICCODE            V1 0xDAA320A7 | V2 0xDAA320AB (2-byte topic length)
      8     4  BODYCRC              zlib's CRC-32 of the body & 0x7FFFFFFF (storage.crc)
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

Record CRC (``StoreConfig.record_crc``, on by default): the last property is
``__CRC32H`` 0x01, ten decimal digits (most significant first, zero-padded), 0x02; 20 bytes. The
digits are zlib.crc32 & 0x7FFFFFFF of everything after the body up to and including the
property's 0x01, continued over the header (TOTALSIZE through BODY LENGTH). It leaves the body
out because BODYCRC, which it covers, already vouches for the body: every byte is covered, and
a put computes one CRC over the body, not two. The part after the body comes first because it is
the same for many messages (topic and tags), so its CRC is computed once and cached.
RocketMQ's ``__CRC32#`` (enabledAppendPropCRC: the same 20 bytes, digits least significant
first, over every byte before the property) is still checked where a record carries it: earlier
tidemq builds wrote it.

Offset message id: store address + store port (int32) + PHYSICALOFFSET (int64), as uppercase hex:
32 characters for an IPv4 store host.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, NoReturn

from tidemq.storage.crc import crc32
from tidemq.storage.errors import (
    BodyTooLargeError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidQueueIdError,
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

# The record CRC property tidemq writes (see the module docstring) and RocketMQ's whole-record
# one, which earlier tidemq builds wrote and readers still check.
PROP_RECORD_CRC: Final = "__CRC32H"
PROP_LEGACY_RECORD_CRC: Final = "__CRC32#"
RECORD_CRC_SIZE: Final = 20  # name (8), 0x01, ten digits, 0x02
_RECORD_CRC_NAME: Final = b"__CRC32H\x01"
_LEGACY_RECORD_CRC_NAME: Final = b"__CRC32#\x01"
_CRC_DIGITS: Final = b"%010d\x02"
_MASK: Final = 0x7FFFFFFF

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
        if sep and name not in (PROP_RECORD_CRC, PROP_LEGACY_RECORD_CRC):
            props[name] = value
    return props


def write_blank(buf: WBuf, pos: int, remaining: int) -> None:
    BLANK.pack_into(buf, pos, remaining, BLANK_MAGIC)


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


class AppendResult(NamedTuple):
    """Where one appended message went. A NamedTuple: one is built per message under the put
    lock, and a frozen dataclass costs four times as much to construct."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp_ms: int
    store_host: tuple[bytes, int]

    @property
    def msg_id(self) -> str:
        """The offset message id; built on demand, outside the append lock."""
        return make_msg_id(self.store_host, self.phy_offset)


class EncodedBatch(NamedTuple):
    """A batch encoded for its place in the log, not yet written anywhere."""

    # (offset, records, fills_file): whole records back to back, or (fills_file, no bytes) the
    # place of a blank marker that ends its file. In log order; each span lies inside one file.
    spans: list[tuple[int, bytes, bool]]
    results: list[AppendResult]
    end: int  # the log's end after the batch
    queue_offsets: dict[tuple[str, int], int]  # next queue offset of every queue the batch used


def record_suffix(msg: Message, record_crc: bool) -> tuple[bytes, int]:
    """What follows the body, and its CRC32 (where the record CRC starts): topic length and
    topic, properties length and properties, ending (with ``record_crc``) in the record CRC
    property's name and separator, whose ten digits and final separator ``encode_batch``
    appends. Validates topic, tags, keys and properties; raises a MessageIllegalError subclass
    on bad input. Messages with neither keys nor properties share one cached suffix per
    (topic, tags)."""
    plain = not msg.keys and not msg.properties
    cache = _SUFFIXES[record_crc]
    if plain:
        cached = cache.get((msg.topic, msg.tags))
        if cached is not None:
            return cached
    prefix = topic_prefix(msg.topic)
    for k in msg.keys:
        if not k or _BAD_KEY_CHARS.search(k):
            raise InvalidPropertyError(f"key {k!r} must be non-empty, free of spaces, \\x01, \\x02")
    keys = " ".join(msg.keys)
    if msg.properties:
        for reserved in (PROP_RECORD_CRC, PROP_LEGACY_RECORD_CRC):
            if reserved in msg.properties:
                # The store's own: a reader drops it, and a client's copy ending the properties
                # would be checked as the record CRC and fail the record as corrupt.
                raise InvalidPropertyError(f"property {reserved} is reserved")
        props = dict(msg.properties)
        if msg.tags:
            props[PROP_TAGS] = msg.tags
        if keys:
            props[PROP_KEYS] = keys
        props_raw = encode_properties(props)
    else:
        if msg.tags and _BAD_PROPERTY_CHARS.search(msg.tags):
            raise InvalidPropertyError("tags must be free of \\x01 and \\x02")
        text = (f"TAGS\x01{msg.tags}\x02" if msg.tags else "") + (
            f"KEYS\x01{keys}\x02" if keys else ""
        )
        props_raw = text.encode("utf-8")
    limit = PROPERTIES_MAX_BYTES - (RECORD_CRC_SIZE if record_crc else 0)
    if len(props_raw) > limit:
        raise PropertiesTooLargeError(
            f"properties are {len(props_raw)} bytes, at most {limit} allowed"
            + (" with the record CRC" if record_crc else "")
        )
    if record_crc:
        suffix = b"".join(
            (prefix, _H.pack(len(props_raw) + RECORD_CRC_SIZE), props_raw, _RECORD_CRC_NAME)
        )
    else:
        suffix = b"".join((prefix, _H.pack(len(props_raw)), props_raw))
    encoded = (suffix, crc32(suffix))
    if plain:
        if len(cache) >= 4_096:
            cache.clear()
        cache[msg.topic, msg.tags] = encoded
    return encoded


_SUFFIXES: dict[bool, dict[tuple[str, str | None], tuple[bytes, int]]] = {False: {}, True: {}}
_new_tuple = tuple.__new__


_HOST_FLAGS: Final = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6


def _header_for(born_addr: bytes, sys_flag: int, store_v6: bool) -> tuple[struct.Struct, int]:
    """The header layout and SYSFLAG for a message off encode_batch's common path (an IPv6 host,
    or host flags the producer set, which the store owns)."""
    if len(born_addr) not in (4, 16):
        raise InvalidPropertyError("born host address must be 4 or 16 bytes")
    born_v6 = len(born_addr) == 16
    sys_flag &= ~_HOST_FLAGS
    if born_v6:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if store_v6:
        sys_flag |= SYSFLAG_STOREHOST_V6
    return HEADERS[born_v6, store_v6], sys_flag


def _refuse(m: Message, max_body_bytes: int) -> NoReturn:
    """The typed error for a message that failed encode_batch's combined range check."""
    if len(m.body) > max_body_bytes:
        raise BodyTooLargeError(f"body is {len(m.body)} bytes, at most {max_body_bytes} allowed")
    if not 0 <= m.queue_id <= _I32_MAX:
        raise InvalidQueueIdError(f"queue id {m.queue_id} out of range")
    raise InvalidPropertyError("born port, born timestamp or transaction offset out of range")


def encode_batch(
    msgs: Sequence[Message],
    start: int,
    file_size: int,
    queue_offsets: Mapping[tuple[str, int], int],
    now_ms: int,
    store_host: tuple[bytes, int],
    max_body_bytes: int,
    record_crc: bool,
) -> EncodedBatch:
    """Validate and encode a batch as records placed from log offset ``start`` on, with blank
    markers where a record does not fit what is left of a file. Raises a MessageIllegalError
    subclass on any bad message, before anything is written anywhere.

    This is the put path's whole per-message cost, so it is one loop: header, body and suffix
    become one bytes object per file (joined once) rather than a copy per field."""
    store_addr, store_port = store_host
    store_v6 = len(store_addr) == 16
    store_flag = SYSFLAG_STOREHOST_V6 if store_v6 else 0
    hdr_v4 = HEADERS[False, store_v6]
    crc_len = RECORD_CRC_SIZE - len(_RECORD_CRC_NAME) if record_crc else 0
    cache = _SUFFIXES[record_crc]
    spans: list[tuple[int, bytes, bool]] = []
    parts: list[bytes] = []
    add = parts.append
    results: list[AppendResult] = []
    result = results.append
    nxt: dict[tuple[str, int], int] = {}
    pos = span_start = start
    file_end = start - start % file_size + file_size
    try:
        for m in msgs:
            topic = m.topic
            qid = m.queue_id
            if m.keys or m.properties:
                suffix, suffix_crc = record_suffix(m, record_crc)
            else:
                cached = cache.get((topic, m.tags))
                suffix, suffix_crc = cached or record_suffix(m, record_crc)
            body = m.body
            if type(body) is not bytes:
                body = bytes(body)
            blen = len(body)
            born_addr, born_port = m.born_host
            born_ts = m.born_timestamp_ms
            sys_flag = m.sys_flag
            if len(born_addr) == 4 and not sys_flag & _HOST_FLAGS:
                hdr = hdr_v4
                sys_flag |= store_flag
            else:
                hdr, sys_flag = _header_for(born_addr, sys_flag, store_v6)
            if not (
                blen <= max_body_bytes
                and 0 <= qid <= _I32_MAX
                and 0 <= born_port <= 65_535
                and born_ts >= 0
                and m.prepared_transaction_offset >= 0
            ):
                _refuse(m, max_body_bytes)
            size = hdr.size + blen + len(suffix) + crc_len
            if pos + size + BLANK_SIZE > file_end:
                if size + BLANK_SIZE > file_size:
                    raise BodyTooLargeError(
                        f"record of {size} bytes cannot fit a CommitLog file of {file_size} bytes"
                    )
                if parts:
                    spans.append((span_start, b"".join(parts), False))
                    parts.clear()
                spans.append((pos, b"", True))
                pos = span_start = file_end
                file_end += file_size
            key = (topic, qid)
            qoff = nxt.get(key)
            if qoff is None:
                qoff = queue_offsets.get(key, 0)
            nxt[key] = qoff + 1
            header = hdr.pack(
                size, MAGIC_V1, crc32(body) & _MASK, qid, m.flag, qoff, pos, sys_flag,
                born_ts or now_ms, born_addr, born_port, now_ms, store_addr, store_port,
                m.reconsume_times, m.prepared_transaction_offset, blen,
            )  # fmt: skip
            add(header)
            add(body)
            add(suffix)
            if crc_len:
                add(_CRC_DIGITS % (crc32(header, suffix_crc) & _MASK))
            result(_new_tuple(AppendResult, (pos, size, qoff, now_ms, store_host)))
            pos += size
    except struct.error:
        # INT32 FLAG and RECONSUMETIMES, INT64 timestamp and offset: struct checks the ranges.
        raise InvalidPropertyError("flag, timestamps, offsets or born host out of range") from None
    if parts:
        spans.append((span_start, b"".join(parts), False))
    return EncodedBatch(spans, results, pos, nxt)


def encode_record(
    msg: Message,
    queue_offset: int,
    phy_offset: int,
    store_timestamp_ms: int,
    store_host: tuple[bytes, int],
    max_body_bytes: int = 4 << 20,
    record_crc: bool = False,
) -> bytes:
    """One whole record as bytes (tests, tools), by the encoder the store's put path uses."""
    batch = encode_batch(
        [msg],
        phy_offset,
        1 << 62,
        {(msg.topic, msg.queue_id): queue_offset},
        store_timestamp_ms,
        store_host,
        max_body_bytes,
        record_crc,
    )
    return batch.spans[0][1]


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
    tidemq's record CRC covers everything but the body and its own ten digits; the body CRC,
    inside the header it covers, vouches for the body. RocketMQ's legacy whole-record CRC covers
    the body too, so when a record carries that one the body CRC adds nothing."""
    fields, body_at, _, _, props_len, end = layout
    body_end = body_at + fields[16]
    with memoryview(buf) as mv:
        name = b""
        if props_len >= RECORD_CRC_SIZE:
            name = mv[end - RECORD_CRC_SIZE : end - 11].tobytes()
        if name == _RECORD_CRC_NAME:
            crc = crc32(mv[pos:body_at], crc32(mv[body_end : end - 11])) & _MASK
            if mv[end - 11 : end].tobytes() != _CRC_DIGITS % crc:
                return "record CRC mismatch"
        elif name == _LEGACY_RECORD_CRC_NAME:
            crc = crc32(mv[pos : end - RECORD_CRC_SIZE]) & _MASK
            if mv[end - 11 : end].tobytes() != str(crc)[::-1].ljust(10, "0").encode() + b"\x02":
                return "record CRC mismatch"
            return None
        elif require:
            return "record CRC property missing"
        if crc32(mv[body_at:body_end]) & _MASK != fields[2]:
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


_host_hex: dict[tuple[bytes, int], str] = {}


def make_msg_id(store_host: tuple[bytes, int], phy_offset: int) -> str:
    # One id per sent and per pulled message, from few distinct hosts: the host part is cached.
    prefix = _host_hex.get(store_host)
    if prefix is None:
        prefix = (store_host[0] + struct.pack(">i", store_host[1])).hex().upper()
        if len(_host_hex) >= 4_096:
            _host_hex.clear()
        _host_hex[store_host] = prefix
    return f"{prefix}{phy_offset:016X}"


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
