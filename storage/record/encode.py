"""Encoding records: validate a producer's messages and lay them out as CommitLog records (see
``layout`` for the bytes), with blank markers where a record does not fit what is left of a file.
The put path's whole per-message cost is here, in ``encode_batch``."""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn

from tidemq.storage.crc import crc32
from tidemq.storage.errors import (
    BodyTooLargeError,
    InvalidPropertyError,
    InvalidQueueIdError,
    InvalidTopicError,
    PropertiesTooLargeError,
)
from tidemq.storage.record.layout import (
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE,
    CRC_DIGITS,
    CRC_MASK,
    HEADERS,
    I16,
    MAGIC_V1,
    PROP_LEGACY_RECORD_CRC,
    PROP_RECORD_CRC,
    PROPERTIES_MAX_BYTES,
    RECORD_CRC_NAME,
    RECORD_CRC_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    TOPIC_MAX_BYTES,
    TOPIC_RE,
    WBuf,
)
from tidemq.storage.record.messages import AppendResult, EncodedBatch, Message
from tidemq.storage.record.properties import (
    BAD_PROPERTY_CHARS,
    PROP_KEYS,
    PROP_TAGS,
    encode_properties,
)

_I32_MAX: Final = (1 << 31) - 1
_BAD_KEY_CHARS = re.compile("[ \x01\x02]")

# Names bound here rather than by the import, for what runs per message: CPython 3.11 compiles
# ``NAME.method(...)`` as a method call, except on a name an import bound, which it takes for a
# module and compiles as an attribute load that builds a bound method on every call.
_BLANK = BLANK
_I16 = I16
_TOPIC_RE = TOPIC_RE
_BAD_PROPERTY_CHARS = BAD_PROPERTY_CHARS

_valid_topics: dict[str, bytes] = {}


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
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicError(
            f"topic {topic!r} may hold only letters, digits, '%', '|', '_', '-'"
        )
    return encoded


def write_blank(buf: WBuf, pos: int, remaining: int) -> None:
    _BLANK.pack_into(buf, pos, remaining, BLANK_MAGIC)


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
            (prefix, _I16.pack(len(props_raw) + RECORD_CRC_SIZE), props_raw, RECORD_CRC_NAME)
        )
    else:
        suffix = b"".join((prefix, _I16.pack(len(props_raw)), props_raw))
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
    crc_len = RECORD_CRC_SIZE - len(RECORD_CRC_NAME) if record_crc else 0
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
                size, MAGIC_V1, crc32(body) & CRC_MASK, qid, m.flag, qoff, pos, sys_flag,
                born_ts or now_ms, born_addr, born_port, now_ms, store_addr, store_port,
                m.reconsume_times, m.prepared_transaction_offset, blen,
            )  # fmt: skip
            add(header)
            add(body)
            add(suffix)
            if crc_len:
                add(CRC_DIGITS % (crc32(header, suffix_crc) & CRC_MASK))
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
