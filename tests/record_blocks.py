"""Sent blocks for the store's tests, made from storage's own encoder: a record as the message
path stores it, turned back into the form a producer sends (``storage.record.block``: the fields
only the broker knows zeroed, no record CRC property). Storing such a block must give back the
message path's bytes, which is what the tests compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tidemq.storage.record import Message, encode_record
from tidemq.storage.record.block import FilledBlock, fill_block, filled_size_bound
from tidemq.storage.record.layout import HEADER_V4, I16, RECORD_CRC_NAME, RECORD_CRC_SIZE

STORE_HOST = (b"\x0a\x00\x00\x05", 10911)
BORN_HOST = (b"\x7f\x00\x00\x01", 5555)


def sent_form(record: bytes) -> bytes:
    """A stored record (IPv4 hosts) as a producer sends it."""
    f = list(HEADER_V4.unpack_from(record, 0))
    body_len = f[16]
    tail = record[HEADER_V4.size + body_len :]
    topic_len = tail[0]
    props_len = I16.unpack_from(tail, 1 + topic_len)[0]
    props = tail[3 + topic_len : 3 + topic_len + props_len]
    if props[-RECORD_CRC_SIZE:].startswith(RECORD_CRC_NAME):
        props = props[:-RECORD_CRC_SIZE]
    f[0] = HEADER_V4.size + body_len + 1 + topic_len + 2 + len(props)
    for k in (2, 5, 6, 7, 10, 11, 13):  # BODYCRC, offsets, SYSFLAG, born port, store time/port
        f[k] = 0
    f[9] = f[12] = b"\0\0\0\0"
    return b"".join(
        (
            HEADER_V4.pack(*f),
            record[HEADER_V4.size : HEADER_V4.size + body_len],
            tail[: 1 + topic_len],
            I16.pack(len(props)),
            props,
        )
    )


def sent_block(msgs: Sequence[Message]) -> bytes:
    """``msgs`` (one topic, one queue) as one sent block."""
    return b"".join(
        sent_form(encode_record(m, 0, 0, 1, STORE_HOST, record_crc=False)) for m in msgs
    )


FilledSpans = list[tuple[int, bytes, bool]]


def fill(
    records: bytes,
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
    head_property: bytes = b"",
    member_sys_flag: int = 0,
    *,
    fill_block: Callable[..., FilledBlock] = fill_block,
) -> tuple[FilledBlock, FilledSpans]:
    """``fill_block`` into a buffer of the bound's size, and its spans with their bytes: (log
    offset, the records, fills_file), as the block's spans were before ``out`` existed."""
    out = bytearray(
        filled_size_bound(
            len(records), count, len(born_host[0]) == 16, len(store_host[0]) == 16, record_crc,
            len(head_property),
        )
    )  # fmt: skip
    args: tuple[Any, ...] = (
        records, count, topic, queue_id, start, file_size, first_queue_offset, now_ms,
        born_host, store_host, max_body_bytes, record_crc, out, 0, head_property,
        member_sys_flag,
    )  # fmt: skip
    filled = fill_block(*args)
    spans = [(at, bytes(out[o : o + n]), fills) for at, o, n, fills in filled.spans]
    return filled, spans
