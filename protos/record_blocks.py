"""Record blocks, the client's side (issue 22, batches not messages): a send's messages encoded
once as CommitLog records, every message's send result derived from the broker's answer for its
block, and pulled records decoded in one call.

Three entry points and two classes (``BlockBuilder``, ``RecordRef``), each with a compiled
implementation (``_crecords``, C through the CPython API) and the pure-Python twin below, which
give the same results and raise the same errors. The compiled one is used when it is built,
unless ``TIDEMQ_PURE_PYTHON=1`` is set; ``IMPLEMENTATION`` says which runs (``"c"`` or
``"python"``), and ``py_encode_block``, the other ``py_`` functions, ``PyBlockBuilder`` and
``PyRecordRef`` are the twins, whichever runs.

The sent block (``RecordBlock.records``)
----------------------------------------
One queue's messages of one topic as RocketMQ V1 CommitLog records with IPv4-sized host fields,
back to back, ``RecordBlock.count`` of them. Every integer is big-endian. Per record::

    off  size  field              as sent
      0     4  TOTALSIZE          the record's size: 91 + body + topic + properties
      4     4  MAGICCODE          0xDAA320A7 (V1)
      8     4  BODYCRC            0
     12     4  QUEUEID            the block's queue (RecordBlock.queue_id), 0 to 2^31-1
     16     4  FLAG               0
     20     8  QUEUEOFFSET        0
     28     8  PHYSICALOFFSET     0
     36     4  SYSFLAG            0
     40     8  BORNTIMESTAMP      the producer's clock, ms, >= 0 (0: the broker's store time)
     48     8  BORNHOST           zero (4-byte address + port)
     56     8  STORETIMESTAMP     0
     64     8  STOREHOSTADDRESS   zero
     72     4  RECONSUMETIMES     0
     76     8  PREPARED TX OFFSET 0
     84     4  BODY LENGTH        then the body
     88+b   1  TOPIC LENGTH       then the topic: the block's (SendMessageRequest.block_topic),
                                  1 to 127 bytes of [%|a-zA-Z0-9_-]
      .     2  PROPERTIES LENGTH  then the properties: ``name 0x01 value 0x02`` for each, UTF-8,
                                  the message's own in their order, then ``TAGS`` (a tag) and
                                  ``KEYS`` (keys joined by one space), as the message path writes
                                  them (``storage.record.encode.record_suffix``)

The broker (``storage.record.block.fill_block``) checks every record and fills what only it
knows: the body CRC, queue and CommitLog offsets, SYSFLAG's host bits, the born host (the
producer's address as it sees it), store timestamp and host, and its record CRC property; the
first record of an idempotent run also gets the run's stamp property. A record as stored is the
sent one plus ``BlockResult.added_bytes`` (the record CRC, 20 bytes, and 12 per IPv6 host), plus
``head_added_bytes`` for the first record of the block. These bytes are the protocol: a block
from any client must be exactly this.

Limits the encoder checks so the broker's additions still fit: properties at most
``MAX_PROPERTIES_BYTES``; a record at most 2^31-1 bytes. Property names the broker writes itself
(the record CRCs, the idempotence stamp) or takes from the tag and keys are refused.

Building a block as messages arrive (``BlockBuilder``)
------------------------------------------------------
``encode_block`` needs every message of a block kept until the block is sent. A producer
instead encodes each message into its topic's open ``BlockBuilder(topic, max_records,
max_bytes)`` as it is sent (aiokafka's ``DefaultRecordBatchBuilder.append``), keeping no Python
object per message; the bytes are exactly ``encode_block``'s for the same messages.

- ``append(body, tag, keys, properties, born_ms=None) -> int`` encodes one record at the end
  (QUEUEID 0; the born timestamp ``born_ms``, or the wall clock in ms when None) and returns its
  index, or -1 when the block is sealed (nothing appended). A bad message raises what
  ``check_message`` raises, with the same texts (the body and born timestamp errors are
  ``encode_block``'s without the "message <i>: "), and appends nothing.
- ``count``, ``size`` (bytes), ``full`` (``count >= max_records`` or ``size >= max_bytes``; a
  first record larger than ``max_bytes`` is still appended: ``append`` refuses only when
  sealed), ``sealed``.
- ``seal() -> bool``: True when this call sealed it. ``append`` and ``seal`` are atomic with
  respect to each other from any threads: a record is in the sealed block exactly when its
  ``append`` returned an index.
- ``records(queue_id) -> bytes``: the sealed block with every QUEUEID ``queue_id``; the last
  answer is kept (a block moved to another queue is asked again with the new id).
- ``results(cls, template, at, ...)``: ``block_results`` of this block, arguments as there
  without ``records``; the records' sizes (4 bytes each) are kept, so it works after
  ``release()``, which seals the block and frees its bytes once the block is answered.

Misuse raises ``RuntimeError`` (``records`` or ``results`` of an open block, ``records`` after
``release``); an empty block's ``records`` raises ``RecordFormatError``, as ``encode_block`` of
no message does.

A message's future (``RecordRef``)
----------------------------------
``RecordRef(owner, index)`` names the ``index``-th record of ``owner`` (its block): two
read-only fields, ``.owner`` and ``.index``. The compiled type has no garbage-collector support,
so its instances are never tracked: hundreds of thousands of futures in flight cost the cyclic
collector nothing (about 0.6 us per message otherwise). A subclass that adds no field
(``__slots__ = ()`` in it and its other bases, as in ``class BlockFuture(RecordRef,
SendFuture): __slots__ = ()``) is a GC type all the same, as CPython 3.11 makes every class
statement's, so ``RecordRef`` untracks its instances as it makes them; one with a ``__dict__``
or slots of its own keeps tracked instances. The price: the collector cannot see an untracked
instance's references (to its owner, and to its class), so a cycle through one is never
collected, and leaks. A cycle exists only if the owner refers back to its refs, so the SDK must
guarantee that an owner keeps none of them, or drops them on every path (a block's callbacks,
which hold its futures, are cleared when it is answered or failed, and every block is one or
the other), and no class attribute holds an instance. The pure twin is a ``__slots__`` class,
tracked like any other.

Send results (``BlockResult``)
------------------------------
Record i of a block is at queue offset ``first_queue_offset + i``; its CommitLog offset is
``first_commitlog_offset`` plus the stored sizes of the records before it, except where
``file_start_indexes`` lists it: then it starts a new CommitLog file, at the offset listed beside
it in ``file_start_offsets``. Its message id is RocketMQ's offset id: uppercase hex of the store
address (4 or 16 bytes), the store port (int32) and the CommitLog offset (int64), as
``storage.record.msg_id.make_msg_id`` writes it. A duplicate too old to be remembered
(``first_queue_offset`` < 0) has queue and CommitLog offsets -1 and an empty message id.

Pulled records (``PullMessageResponse.records``)
------------------------------------------------
Records exactly as the CommitLog holds them (``storage.record.layout``: V1 or V2 magic, IPv4 or
IPv6 hosts as SYSFLAG says, any properties). The broker checked their CRCs before it sent them;
``decode_records`` checks their shape only and refuses malformed bytes with
``RecordFormatError``, never reading past them.
"""

from __future__ import annotations

import array
import ipaddress
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

from tidemq.protos.wire import varint

T = TypeVar("T")
_RefT = TypeVar("_RefT")
TupleT = TypeVar("TupleT", bound=tuple[Any, ...])
# (body, tag ("" or None: none), keys, properties or None, born timestamp ms)
BlockMessage = tuple[bytes, str | None, Sequence[str], Mapping[str, str] | None, int]


class RecordFormatError(ValueError):
    """Input that cannot be encoded as, or bytes that are not, records in the format this module
    documents. Raised before anything is returned; the message names the record and the
    problem."""


MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
FIXED_OVERHEAD: Final = 91  # a V1 record with IPv4 hosts, empty body, topic and properties
HEADER_SIZE: Final = 88  # TOTALSIZE through BODY LENGTH, IPv4 hosts
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20
TOPIC_MAX_BYTES: Final = 127
# PROPERTIES LENGTH is an int16 (32767), and the broker appends to what a producer sends: its
# record CRC property (20 bytes) and, on the first record of an idempotent run, the stamp
# "PRODUCER_SEQ" 0x01 id.epoch.sequence.count 0x02, at most 13 + 16 + 1 + 8 + 1 + 16 + 1 + 8 + 1
# = 65 bytes (int64 id and sequence, int32 epoch and count, in hex). A message that fits this
# limit is never refused by the broker for its properties.
MAX_PROPERTIES_BYTES: Final = 32_767 - 20 - 65
RESERVED_PROPERTIES: Final = ("TAGS", "KEYS", "__CRC32H", "__CRC32#", "PRODUCER_SEQ")
_I32_MAX: Final = (1 << 31) - 1
_I64_MAX: Final = (1 << 63) - 1
_I32_MIN: Final = -(1 << 31)
_I64_MIN: Final = -(1 << 63)

_HEADER_V4 = struct.Struct(">iIiiiqqiqqqqiqi")  # hosts as one int64 each: always zero here
_SIZE = struct.Struct(">i")
_SIZE_MAGIC = struct.Struct(">iI")
_I16 = struct.Struct(">h")
_RECORD_HEADERS = {
    (b, s): struct.Struct(
        ">iIiiiqqiq" + ("16si" if b else "4si") + "q" + ("16si" if s else "4si") + "iqi"
    )
    for b in (False, True)
    for s in (False, True)
}
_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
_FROM_TAGS_AND_KEYS = ("TAGS", "KEYS")
# Properties a reader never sees: the tag and keys have their own fields, the rest is the
# broker's (record CRCs, the idempotence stamp).
_NOT_PROPERTIES = frozenset(("TAGS", "KEYS", "__CRC32H", "__CRC32#", "PRODUCER_SEQ"))
_ABSTRACT_FLAG = 1 << 20  # Py_TPFLAGS_IS_ABSTRACT: object.__new__ refuses such a class
_new_object = object.__new__
_new_tuple = tuple.__new__
_set_attr = object.__setattr__


def ipv6_text(address: bytes) -> str:
    """An IPv6 address as ``ipaddress`` writes it (the broker's ``host_str``); the compiled
    decoder calls this too, once per distinct host per call."""
    return str(ipaddress.IPv6Address(address))


# ---------------------------------------------------------------- shared checks (pure Python)
def _type_name(value: object) -> str:
    return type(value).__name__


def _sequence(value: Any, problem: str) -> list[Any] | tuple[Any, ...]:
    """A list or tuple as is, another iterable as a list; ``problem`` (a TypeError) when it is
    not iterable. The compiled twin does the same through PySequence_List."""
    if isinstance(value, list | tuple):
        return value
    try:
        return list(value)
    except TypeError:
        raise TypeError(problem) from None


def _utf8(value: str, where: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordFormatError(f"{where}{what} is not valid UTF-8 text") from None


def _topic_prefix(topic: object) -> bytes:
    """The topic's length byte and bytes as every record of a block carries them."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, not {_type_name(topic)}")
    if not topic:
        raise RecordFormatError("topic is empty")
    # surrogatepass: the length a lone surrogate would take, as the compiled twin counts it.
    size = len(topic.encode("utf-8", "surrogatepass"))
    if size > TOPIC_MAX_BYTES:
        raise RecordFormatError(f"topic is {size} bytes, at most {TOPIC_MAX_BYTES} allowed")
    if not _TOPIC_RE.fullmatch(topic):
        raise RecordFormatError(
            f"topic {topic!r} may hold only letters, digits, '%', '|', '_', '-'"
        )
    return bytes((size,)) + topic.encode("ascii")


def _properties(where: str, tag: object, keys: object, properties: object) -> bytes:
    """A message's properties as its record carries them, after every per-message check, in the
    order the compiled twin makes them: tag, keys, then each property in order. ``where``
    prefixes every error ("message 3: ", or "")."""
    tag_raw = b""
    if tag is not None:
        if not isinstance(tag, str):
            raise TypeError(f"{where}tag must be str or None, not {_type_name(tag)}")
        tag_raw = _utf8(tag, where, f"tag {tag!r}")
        if b"\x01" in tag_raw or b"\x02" in tag_raw:
            raise RecordFormatError(f"{where}tag {tag!r} holds \\x01 or \\x02")
    if isinstance(keys, str | bytes):
        raise TypeError(f"{where}keys must be a sequence of str, not {_type_name(keys)}")
    key_list = _sequence(keys, f"{where}keys must be a sequence of str, not {_type_name(keys)}")
    keys_raw = []
    for key in key_list:
        if not isinstance(key, str):
            raise TypeError(f"{where}keys must be str, not {_type_name(key)}")
        raw = _utf8(key, where, f"key {key!r}")
        if not raw:
            raise RecordFormatError(f"{where}a key is empty")
        if b" " in raw or b"\x01" in raw or b"\x02" in raw:
            raise RecordFormatError(f"{where}key {key!r} holds a space, \\x01 or \\x02")
        keys_raw.append(raw)
    parts: list[bytes] = []
    if properties is not None:
        if isinstance(properties, dict):
            items: Any = properties.items()
        elif isinstance(properties, Mapping):
            items = list(properties.items())
            for pair in items:
                if not isinstance(pair, tuple) or len(pair) != 2:
                    raise TypeError(f"{where}properties' items must be (name, value) pairs")
        else:
            raise TypeError(
                f"{where}properties must be a mapping of str to str or None, not "
                f"{_type_name(properties)}"
            )
        for name, value in items:
            if not isinstance(name, str):
                raise TypeError(f"{where}property names must be str, not {_type_name(name)}")
            if not isinstance(value, str):
                raise TypeError(
                    f"{where}the value of property {name!r} must be str, not {_type_name(value)}"
                )
            name_raw = _utf8(name, where, f"property name {name!r}")
            if not name_raw:
                raise RecordFormatError(f"{where}a property name is empty")
            if b"\x01" in name_raw or b"\x02" in name_raw:
                raise RecordFormatError(f"{where}property name {name!r} holds \\x01 or \\x02")
            if name in RESERVED_PROPERTIES:
                if name in _FROM_TAGS_AND_KEYS:
                    raise RecordFormatError(
                        f"{where}property {name} is reserved: the tag and keys set it"
                    )
                raise RecordFormatError(f"{where}property {name} is reserved for the broker")
            value_raw = _utf8(value, where, f"the value of property {name!r}")
            if b"\x01" in value_raw or b"\x02" in value_raw:
                raise RecordFormatError(
                    f"{where}the value of property {name!r} holds \\x01 or \\x02"
                )
            parts += (name_raw, b"\x01", value_raw, b"\x02")
    if tag_raw:
        parts += (b"TAGS\x01", tag_raw, b"\x02")
    if keys_raw:
        parts += (b"KEYS\x01", b" ".join(keys_raw), b"\x02")
    raw = b"".join(parts)
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise RecordFormatError(
            f"{where}properties are {len(raw)} bytes encoded (tag and keys included), at most "
            f"{MAX_PROPERTIES_BYTES} allowed"
        )
    return raw


# ------------------------------------------------------------------------- the pure twins
def py_check_message(
    tag: str | None, keys: Sequence[str], properties: Mapping[str, str] | None
) -> None:
    """The per-message checks of ``encode_block`` alone (tag, keys, properties and their encoded
    size), so a producer can refuse one bad message at send time rather than its whole block."""
    if (
        properties is not None
        or not (tag is None or (isinstance(tag, str) and not tag))
        or not isinstance(keys, tuple | list)
        or keys
    ):
        _properties("", tag, keys, properties)


def py_encode_block(topic: str, queue_id: int, messages: Sequence[BlockMessage]) -> bytes:
    """``messages`` of ``topic`` for queue ``queue_id`` as one sent block (module docstring);
    each message is (body, tag ("" or None: none), keys, properties or None, born timestamp
    ms). Raises ``RecordFormatError`` (``TypeError`` for a value of the wrong type) naming the
    message and the problem."""
    prefix = _topic_prefix(topic)
    if not isinstance(queue_id, int):
        raise TypeError(f"queue id must be int, not {_type_name(queue_id)}")
    if not 0 <= queue_id <= _I32_MAX:
        raise RecordFormatError(f"queue id {queue_id!s} is out of range (0 to {_I32_MAX})")
    msgs = _sequence(messages, f"messages must be a sequence of tuples, not {_type_name(messages)}")
    if not msgs:
        raise RecordFormatError("a block holds at least one message")
    overhead = FIXED_OVERHEAD + len(prefix) - 1
    pack = _HEADER_V4.pack
    pack_i16 = _I16.pack
    parts: list[bytes] = []
    add = parts.append
    for i, m in enumerate(msgs):
        if not isinstance(m, tuple) or len(m) != 5:
            raise TypeError(
                f"message {i}: not a (body, tag, keys, properties, born timestamp ms) tuple"
            )
        body, tag, keys, properties, born = m
        if not isinstance(body, bytes):
            raise TypeError(f"message {i}: body must be bytes, not {_type_name(body)}")
        if (
            properties is None
            and (tag is None or (isinstance(tag, str) and not tag))
            and isinstance(keys, tuple | list)
            and not keys
        ):
            props = b""  # the common message: nothing to check or encode
        else:
            props = _properties(f"message {i}: ", tag, keys, properties)
        if not isinstance(born, int):
            raise TypeError(f"message {i}: born timestamp must be int, not {_type_name(born)}")
        if not 0 <= born <= _I64_MAX:
            raise RecordFormatError(
                f"message {i}: born timestamp {born!s} is out of range (0 to 2^63-1)"
            )
        body_len = len(body)
        max_body = _I32_MAX - overhead - len(props)
        if body_len > max_body:
            raise RecordFormatError(
                f"message {i}: body is {body_len} bytes, at most {max_body} allowed"
            )
        add(pack(overhead + body_len + len(props), MAGIC_V1, 0, queue_id, 0, 0, 0, 0, born,
                 0, 0, 0, 0, 0, body_len))  # fmt: skip
        add(body)
        add(prefix)
        add(pack_i16(len(props)))
        add(props)
    return b"".join(parts)


def _check_int(value: object, name: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{name} must be int, not {_type_name(value)}")
    return value


def _int_sequence(value: object, name: str) -> list[int]:
    problem = f"{name} must be a sequence of int"
    items = _sequence(value, problem)
    for v in items:
        if not isinstance(v, int):
            raise TypeError(problem)
    return list(items)


def _msg_id_prefix(store_host: bytes, store_port: int) -> str:
    return (store_host + store_port.to_bytes(4, "big", signed=True)).hex().upper()


def _check_store_host(store_host: bytes, store_port: int) -> None:
    if len(store_host) not in (4, 16):
        raise RecordFormatError(
            f"store host address is {len(store_host)} bytes, not 4 (IPv4) or 16 (IPv6)"
        )
    if not _I32_MIN <= store_port <= _I32_MAX:
        raise RecordFormatError(f"store port {store_port!s} is out of range")


def py_make_msg_id(store_address: bytes, store_port: int, commitlog_offset: int) -> str:
    """RocketMQ's offset message id: uppercase hex of the store address (4 or 16 bytes), the
    store port (int32) and the CommitLog offset (int64)."""
    if not isinstance(store_address, bytes):
        raise TypeError(f"store address must be bytes, not {_type_name(store_address)}")
    _check_int(store_port, "store port")
    _check_int(commitlog_offset, "commitlog offset")
    _check_store_host(store_address, store_port)
    if not 0 <= commitlog_offset <= _I64_MAX:
        raise RecordFormatError(
            f"commitlog offset {commitlog_offset!s} is out of range (0 to 2^63-1)"
        )
    return f"{_msg_id_prefix(store_address, store_port)}{commitlog_offset:016X}"


def _sent_sizes(records: bytes) -> list[int]:
    """The TOTALSIZE of each record of a sent block."""
    sizes: list[int] = []
    pos = 0
    n = len(records)
    while pos < n:
        avail = n - pos
        if avail < FIXED_OVERHEAD:
            raise RecordFormatError(
                f"record {len(sizes)} of the block: {avail} bytes left, fewer than the "
                f"{FIXED_OVERHEAD} of the smallest record"
            )
        size = _SIZE.unpack_from(records, pos)[0]
        if not FIXED_OVERHEAD <= size <= avail:
            raise RecordFormatError(
                f"record {len(sizes)} of the block: size {size} does not fit the {avail} bytes left"
            )
        sizes.append(size)
        pos += size
    return sizes


def py_block_results(
    cls: type[TupleT],
    template: TupleT,
    at: tuple[int, int, int],
    records: bytes,
    first_queue_offset: int,
    first_commitlog_offset: int,
    added_bytes: int,
    head_added_bytes: int,
    file_start_indexes: Sequence[int],
    file_start_offsets: Sequence[int],
    store_host: bytes,
    store_port: int,
) -> list[TupleT]:
    """The send results of one block (``records``, as sent) from the broker's answer for it
    (``BlockResult``; module docstring): one ``cls`` per record, ``template`` with the fields at
    the indexes ``at`` = (msg_id, queue_offset, commitlog_offset) replaced by the record's."""
    return _derive_results(
        cls, template, at, records, None, first_queue_offset, first_commitlog_offset,
        added_bytes, head_added_bytes, file_start_indexes, file_start_offsets, store_host,
        store_port,
    )  # fmt: skip


def _derive_results(
    cls: type[TupleT],
    template: TupleT,
    at: tuple[int, int, int],
    records: object,
    sizes: Sequence[int] | None,
    first_queue_offset: int,
    first_commitlog_offset: int,
    added_bytes: int,
    head_added_bytes: int,
    file_start_indexes: Sequence[int],
    file_start_offsets: Sequence[int],
    store_host: bytes,
    store_port: int,
) -> list[TupleT]:
    """``py_block_results``, the records' sizes read from ``records`` or, when ``sizes`` is not
    None, given (a ``BlockBuilder``'s, valid by construction; ``records`` is not used)."""
    if not isinstance(cls, type) or not issubclass(cls, tuple):
        raise TypeError("cls must be a tuple subclass (a NamedTuple class)")
    if not isinstance(template, cls):
        raise TypeError(f"template must be a {cls.__name__}, not {_type_name(template)}")
    if not isinstance(at, tuple) or len(at) != 3 or not all(isinstance(k, int) for k in at):
        raise TypeError("at must be a tuple of three field indexes")
    fields = len(template)
    for k in at:
        if not 0 <= k < fields:
            raise RecordFormatError(f"field index {k!s} is out of range for {fields} fields")
    if sizes is None and not isinstance(records, bytes):
        raise TypeError(f"records must be bytes, not {_type_name(records)}")
    _check_int(first_queue_offset, "first_queue_offset")
    _check_int(first_commitlog_offset, "first_commitlog_offset")
    _check_int(added_bytes, "added_bytes")
    _check_int(head_added_bytes, "head_added_bytes")
    starts = _int_sequence(file_start_indexes, "file_start_indexes")
    start_offsets = _int_sequence(file_start_offsets, "file_start_offsets")
    if not isinstance(store_host, bytes):
        raise TypeError(f"store host must be bytes, not {_type_name(store_host)}")
    _check_int(store_port, "store port")
    for name, v in (
        ("first_queue_offset", first_queue_offset),
        ("first_commitlog_offset", first_commitlog_offset),
    ):
        if not _I64_MIN <= v <= _I64_MAX:
            raise RecordFormatError(f"{name} {v!s} is out of range")
    for name, v in (("added_bytes", added_bytes), ("head_added_bytes", head_added_bytes)):
        if not 0 <= v <= _I32_MAX:
            raise RecordFormatError(f"{name} {v!s} is out of range (0 to {_I32_MAX})")
    _check_store_host(store_host, store_port)
    if len(starts) != len(start_offsets):
        raise RecordFormatError("file_start_indexes and file_start_offsets differ in length")
    if sizes is None:
        assert isinstance(records, bytes)
        sizes = _sent_sizes(records)
    count = len(sizes)
    previous = -1
    for k, start_offset in zip(starts, start_offsets, strict=True):
        if not previous < k < count:
            raise RecordFormatError(
                f"file start index {k!s} is out of order or past the block's {count} records"
            )
        if not 0 <= start_offset <= _I64_MAX:
            raise RecordFormatError(f"file start offset {start_offset!s} is out of range")
        previous = k
    i_id, i_qoff, i_coff = at
    values = list(template)
    out: list[TupleT] = []
    if first_queue_offset < 0:  # a duplicate stored too long ago to be remembered
        values[i_id], values[i_qoff], values[i_coff] = "", -1, -1
        return [_new_tuple(cls, values) for _ in range(count)]
    if first_commitlog_offset < 0:
        raise RecordFormatError(
            f"first_commitlog_offset {first_commitlog_offset!s} is out of range"
        )
    if first_queue_offset > _I64_MAX - count + 1:
        raise RecordFormatError("queue offsets run past 2^63-1")
    prefix = _msg_id_prefix(store_host, store_port)
    file_starts = dict(zip(starts, start_offsets, strict=True))
    pos = first_commitlog_offset
    for i, size in enumerate(sizes):
        if file_starts:
            pos = file_starts.get(i, pos)
        if pos > _I64_MAX:
            raise RecordFormatError("CommitLog offsets run past 2^63-1")
        values[i_id] = f"{prefix}{pos:016X}"
        values[i_qoff] = first_queue_offset + i
        values[i_coff] = pos
        out.append(_new_tuple(cls, values))
        pos += size + added_bytes + (head_added_bytes if i == 0 else 0)
    return out


# The fields decode_records gives every record, besides ``common``'s.
_DECODED_FIELDS = (
    "topic", "queue_id", "queue_offset", "body", "tag", "keys", "properties", "msg_id",
    "born_timestamp_ms", "store_timestamp_ms", "commitlog_offset", "born_host", "store_host",
    "reconsume_times",
)  # fmt: skip


class _Slotted:
    __slots__ = ("slot",)


_MEMBER_DESCRIPTOR = type(_Slotted.__dict__["slot"])


def _check_instance_class(cls: object) -> type:
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, not {_type_name(cls)}")
    new: object = cls.__new__
    if new is not _new_object:
        raise TypeError(f"{cls.__name__} is not created by object.__new__")
    if cls.__flags__ & _ABSTRACT_FLAG:
        raise TypeError(f"{cls.__name__} is abstract")
    return cls


def _slots_of(cls: type, names: Iterable[str]) -> dict[str, Any] | None:
    """The slot setters of ``names`` for a class whose instances have no ``__dict__`` (its
    fields are slots), None for a class with ``__dict__``; a name without a slot is refused."""
    if cls.__dictoffset__:
        return None
    setters = {}
    for name in names:
        slot: Any = getattr(cls, name, None)
        if type(slot) is not _MEMBER_DESCRIPTOR:
            raise TypeError(f"{cls.__name__} has neither a __dict__ nor a slot {name!r}")
        setters[name] = slot.__set__
    return setters


def _host_text(raw: bytes) -> str:
    """An address + int32 port as the broker's ``host_str`` writes it."""
    port = int.from_bytes(raw[-4:], "big", signed=True)
    address = raw[:-4]
    if len(address) == 4:
        return f"{address[0]}.{address[1]}.{address[2]}.{address[3]}:{port}"
    return f"[{ipv6_text(address)}]:{port}"


def _bad_record(index: int, pos: int, problem: str) -> RecordFormatError:
    return RecordFormatError(f"record {index} at byte {pos}: {problem}")


def py_decode_records(cls: type[T], common: dict[str, Any], records: bytes) -> list[T]:
    """Pulled records (stored form, back to back) as instances of ``cls`` made without its
    ``__init__``: each ``__dict__`` is a copy of ``common`` plus the record's fields (topic,
    queue_id, queue_offset, body, tag, keys, properties, msg_id, born_timestamp_ms,
    store_timestamp_ms, commitlog_offset, born_host, store_host, reconsume_times); for a class
    whose instances have no ``__dict__`` (a dataclass with slots), the same values go in their
    slots (one for each name of ``common`` and each field)."""
    _check_instance_class(cls)
    if not isinstance(common, dict):
        raise TypeError(f"common must be a dict, not {_type_name(common)}")
    if not isinstance(records, bytes):
        raise TypeError(f"records must be bytes, not {_type_name(records)}")
    setters = _slots_of(cls, [*common, *_DECODED_FIELDS])
    out: list[T] = []
    topics: dict[bytes, str] = {}
    hosts: dict[bytes, str] = {}
    id_prefixes: dict[bytes, str] = {}
    n = len(records)
    pos = 0
    while pos < n:
        avail = n - pos
        if avail < FIXED_OVERHEAD:
            raise _bad_record(
                len(out),
                pos,
                f"{avail} bytes left, fewer than the {FIXED_OVERHEAD} of the smallest record",
            )
        size, magic = _SIZE_MAGIC.unpack_from(records, pos)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise _bad_record(len(out), pos, f"bad magic 0x{magic:08X}")
        sys_flag = _SIZE.unpack_from(records, pos + 36)[0]
        born_v6 = bool(sys_flag & SYSFLAG_BORNHOST_V6)
        store_v6 = bool(sys_flag & SYSFLAG_STOREHOST_V6)
        hdr = _RECORD_HEADERS[born_v6, store_v6]
        topic_len_size = 2 if magic == MAGIC_V2 else 1
        smallest = hdr.size + topic_len_size + 2
        if size < smallest:
            raise _bad_record(len(out), pos, f"size {size} is below the {smallest} of its fields")
        if size > avail:
            raise _bad_record(len(out), pos, f"size {size} runs past the {avail} bytes left")
        end = pos + size
        f = hdr.unpack_from(records, pos)
        body_len = f[16]
        body_at = pos + hdr.size
        topic_len_at = body_at + body_len
        if body_len < 0 or topic_len_at + topic_len_size + 2 > end:
            raise _bad_record(len(out), pos, f"body length {body_len} runs past the record")
        if topic_len_size == 2:
            topic_len = _I16.unpack_from(records, topic_len_at)[0]
        else:
            topic_len = records[topic_len_at]
        topic_at = topic_len_at + topic_len_size
        props_len_at = topic_at + topic_len
        if topic_len < 0 or props_len_at + 2 > end:
            raise _bad_record(len(out), pos, f"topic length {topic_len} runs past the record")
        props_len = _I16.unpack_from(records, props_len_at)[0]
        if props_len_at + 2 + props_len != end:
            raise _bad_record(
                len(out), pos, f"properties length {props_len} does not match the record's size"
            )
        if props_len and records[end - 1] != 0x02:
            raise _bad_record(len(out), pos, "properties do not end with 0x02")
        phy = f[6]
        if phy < 0:
            raise _bad_record(len(out), pos, f"PHYSICALOFFSET {phy} is negative")
        topic_raw = records[topic_at:props_len_at]
        topic = topics.get(topic_raw)
        if topic is None:
            topic = topics[topic_raw] = topic_raw.decode("utf-8", "replace")
        tag = None
        keys: tuple[str, ...] = ()
        props: dict[str, str] = {}
        if props_len:
            keys_text = None
            for item in records[props_len_at + 2 : end].decode("utf-8", "replace").split("\x02"):
                name, sep, value = item.partition("\x01")
                if not sep:
                    continue
                if name in _NOT_PROPERTIES:
                    if name == "TAGS":
                        tag = value
                    elif name == "KEYS":
                        keys_text = value
                else:
                    props[name] = value
            if tag == "":
                tag = None
            if keys_text is not None:
                keys = tuple(k for k in keys_text.split(" ") if k)
        store_at = pos + 60 + (16 if born_v6 else 4)  # past BORNHOST and STORETIMESTAMP
        born_raw = records[pos + 48 : store_at - 8]
        store_raw = records[store_at : body_at - 16]
        born_host = hosts.get(born_raw)
        if born_host is None:
            born_host = hosts[born_raw] = _host_text(born_raw)
        store_host = hosts.get(store_raw)
        if store_host is None:
            store_host = hosts[store_raw] = _host_text(store_raw)
        id_prefix = id_prefixes.get(store_raw)
        if id_prefix is None:
            id_prefix = id_prefixes[store_raw] = store_raw.hex().upper()
        fields = {
            **common,
            "topic": topic,
            "queue_id": f[3],
            "queue_offset": f[5],
            "body": records[body_at:topic_len_at],
            "tag": tag,
            "keys": keys,
            "properties": props,
            "msg_id": f"{id_prefix}{phy:016X}",
            "born_timestamp_ms": f[8],
            "store_timestamp_ms": f[11],
            "commitlog_offset": phy,
            "born_host": born_host,
            "store_host": store_host,
            "reconsume_times": f[14],
        }
        obj = _new_object(cls)
        if setters is None:
            _set_attr(obj, "__dict__", fields)
        else:
            for name, value in fields.items():
                setters[name](obj, value)
        out.append(obj)
        pos = end
    return out


# ---------------------------------------------------------------- building a block (pure twin)
class PyBlockBuilder:
    """The pure twin of ``_crecords.BlockBuilder``: an open record block of one topic, each
    message encoded into it as it is appended (module docstring, "Building a block"). A lock
    makes ``append`` and ``seal`` atomic with respect to each other, as the GIL does for the
    compiled one."""

    __slots__ = (
        "_buf",
        "_count",
        "_lock",
        "_max_bytes",
        "_max_records",
        "_overhead",
        "_prefix",
        "_records",
        "_records_queue",
        "_released",
        "_sealed",
        "_size",
        "_sizes",
    )
    _buf: bytearray
    _count: int
    _lock: threading.Lock
    _max_bytes: int
    _max_records: int
    _overhead: int
    _prefix: bytes
    _records: bytes | None  # the last records(queue_id) answer
    _records_queue: int
    _released: bool
    _sealed: bool
    _size: int
    _sizes: array.array[int]  # 4 bytes a record: what results() needs after release()

    def __new__(cls, topic: str, max_records: int, max_bytes: int) -> Self:
        prefix = _topic_prefix(topic)
        for name, value in (("max_records", max_records), ("max_bytes", max_bytes)):
            _check_int(value, name)
            if not 1 <= value <= _I32_MAX:
                raise ValueError(f"{name} {value!s} is out of range (1 to {_I32_MAX})")
        self = _new_object(cls)
        self._prefix = prefix
        self._overhead = FIXED_OVERHEAD + len(prefix) - 1
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._buf = bytearray()
        self._sizes = array.array("i")
        self._count = 0
        self._size = 0
        self._sealed = False
        self._released = False
        self._records = None
        self._records_queue = -1
        self._lock = threading.Lock()
        return self

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The compiled one is final (it cannot be subclassed): code that works with the twin
        # must work with it.
        raise TypeError(f"type {PyBlockBuilder.__name__!r} is not an acceptable base type")

    def append(
        self,
        body: bytes,
        tag: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        born_ms: int | None = None,
    ) -> int:
        """Encodes one message at the end of the block and returns its index, or -1 (nothing
        appended) when the block is sealed. A bad message raises what ``check_message`` raises
        (or the born timestamp's or the body's size error) and appends nothing."""
        if not isinstance(body, bytes):
            raise TypeError(f"body must be bytes, not {_type_name(body)}")
        if (
            properties is None
            and (tag is None or (isinstance(tag, str) and not tag))
            and isinstance(keys, tuple | list)
            and not keys
        ):
            props = b""  # the common message: nothing to check or encode
        else:
            props = _properties("", tag, keys, properties)
        if born_ms is None:
            born = time.time_ns() // 1_000_000
        else:
            if not isinstance(born_ms, int):
                raise TypeError(f"born timestamp must be int, not {_type_name(born_ms)}")
            if not 0 <= born_ms <= _I64_MAX:
                raise RecordFormatError(f"born timestamp {born_ms!s} is out of range (0 to 2^63-1)")
            born = born_ms
        body_len = len(body)
        max_body = _I32_MAX - self._overhead - len(props)
        if body_len > max_body:
            raise RecordFormatError(f"body is {body_len} bytes, at most {max_body} allowed")
        size = self._overhead + body_len + len(props)
        head = _HEADER_V4.pack(size, MAGIC_V1, 0, 0, 0, 0, 0, 0, born, 0, 0, 0, 0, 0, body_len)
        props_len = _I16.pack(len(props))
        with self._lock:
            if self._sealed:
                return -1
            buf = self._buf
            buf += head  # QUEUEID 0: records(queue_id) writes the queue
            buf += body
            buf += self._prefix
            buf += props_len
            buf += props
            self._sizes.append(size)
            self._size += size
            index = self._count
            self._count = index + 1
        return index

    def add(
        self,
        ref_class: Callable[[Any, int], _RefT],
        owner: Any,
        body: bytes,
        tag: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        /,
    ) -> _RefT | None:
        """``append`` answered as ``ref_class(owner, index)`` (the SDK's future of the message:
        one call instead of two), or None when the block is sealed (nothing appended)."""
        index = self.append(body, tag, keys, properties)
        return None if index < 0 else ref_class(owner, index)

    def seal(self) -> bool:
        """No append after this; True when this call sealed the block."""
        with self._lock:
            if self._sealed:
                return False
            self._sealed = True
            return True

    def records(self, queue_id: int, /) -> bytes:
        """The sealed block's records with every QUEUEID ``queue_id`` (the last answer is kept:
        asked again for the same queue, it is returned as is)."""
        with self._lock:
            if not self._sealed:
                raise RuntimeError("the block is not sealed")
            if self._released:
                raise RuntimeError("the block was released")
            _check_int(queue_id, "queue id")
            if not 0 <= queue_id <= _I32_MAX:
                raise RecordFormatError(f"queue id {queue_id!s} is out of range (0 to {_I32_MAX})")
            if not self._count:
                raise RecordFormatError("a block holds at least one message")
            if self._records is not None and self._records_queue == queue_id:
                return self._records
            buf = self._buf
            pack_into = _SIZE.pack_into
            at = 12  # QUEUEID
            for size in self._sizes:
                pack_into(buf, at, queue_id)
                at += size
            out = self._records = bytes(buf)
            self._records_queue = queue_id
            return out

    def results(
        self,
        cls: type[TupleT],
        template: TupleT,
        at: tuple[int, int, int],
        first_queue_offset: int,
        first_commitlog_offset: int,
        added_bytes: int,
        head_added_bytes: int,
        file_start_indexes: Sequence[int],
        file_start_offsets: Sequence[int],
        store_host: bytes,
        store_port: int,
    ) -> list[TupleT]:
        """``block_results`` of this sealed block (its records' sizes are kept, so this works
        after ``release``)."""
        if not self._sealed:
            raise RuntimeError("the block is not sealed")
        return _derive_results(
            cls, template, at, None, self._sizes, first_queue_offset, first_commitlog_offset,
            added_bytes, head_added_bytes, file_start_indexes, file_start_offsets, store_host,
            store_port,
        )  # fmt: skip

    def release(self) -> None:
        """Seals the block and frees its records, keeping their sizes for ``results``."""
        with self._lock:
            self._sealed = self._released = True
            self._buf = bytearray()
            self._records = None

    @property
    def count(self) -> int:
        return self._count

    @property
    def size(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        return self._count >= self._max_records or self._size >= self._max_bytes

    @property
    def sealed(self) -> bool:
        return self._sealed


class PyRecordRef:
    """The pure twin of ``_crecords.RecordRef``: the ``index``-th record of ``owner``,
    immutable. Unlike the compiled one, its instances are tracked by the cyclic collector."""

    __slots__ = ("index", "owner")
    owner: Any
    index: int

    def __new__(cls, owner: Any, index: int) -> Self:
        if type(index) is not int:
            if not isinstance(index, int):
                raise TypeError(f"index must be int, not {_type_name(index)}")
            value = int(index)  # a bool or another int subclass reads back as an int
        else:
            value = index
        if not 0 <= value <= _I64_MAX:
            raise ValueError(f"index {index!s} is out of range (0 to 2^63-1)")
        self = _new_object(cls)  # refuses a subclass with abstract methods left
        _set_ref_owner(self, owner)
        _set_ref_index(self, value)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _REF_FIELDS:
            raise AttributeError("readonly attribute")
        _set_attr(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _REF_FIELDS:
            raise AttributeError("readonly attribute")
        object.__delattr__(self, name)


_REF_FIELDS: Final = frozenset(("owner", "index"))
_set_ref_owner = PyRecordRef.__dict__["owner"].__set__  # the slots' own setters
_set_ref_index = PyRecordRef.__dict__["index"].__set__


# ------------------------------------------------------------------- the implementation used
# SendMessageRequest.blocks (field 8) and RecordBlock's fields (broker.proto), as wire tags:
# (field number << 3) | wire type (0 varint, 2 length-delimited).
_BLOCKS_TAG = bytes(((8 << 3) | 2,))
_QUEUE_ID_TAG, _RECORDS_TAG, _COUNT_TAG, _FIRST_SEQUENCE_TAG = 0x08, 0x12, 0x18, 0x20


def encode_send_request(head: bytes, blocks: Sequence[tuple[int, bytes, int, int]]) -> bytes:
    """A SendMessageRequest as sent: ``head`` (the request without its blocks, serialized by
    protobuf) followed by one ``blocks`` entry per (queue id, records, count, first sequence),
    written here so that each block's records are copied once, into the request (building a
    RecordBlock copies them into the message, and serializing it copies them again). Protobuf
    reads concatenated encodings of a message as one message, repeated fields appended."""
    parts = [head]
    for queue_id, records, count, first_sequence in blocks:
        if queue_id < 0 or count < 0 or first_sequence < 0:
            raise RecordFormatError("queue id, count and first sequence must be >= 0")
        fields = b"".join(
            (
                bytes((_QUEUE_ID_TAG,)),
                varint(queue_id),
                bytes((_COUNT_TAG,)),
                varint(count),
                bytes((_FIRST_SEQUENCE_TAG,)),
                varint(first_sequence),
                bytes((_RECORDS_TAG,)),
                varint(len(records)),
            )
        )
        parts += (_BLOCKS_TAG, varint(len(fields) + len(records)), fields, records)
    return b"".join(parts)


def _compiled() -> Any:
    """The compiled twin, told this module's error class and IPv6 formatter, or None when it is
    not built."""
    try:
        from tidemq.protos import _crecords  # noqa: PLC0415 - optional: the build may lack it
    except ImportError:
        return None
    _crecords.configure(RecordFormatError, ipv6_text)
    return _crecords


_c = _compiled()
_FORCE_PURE = os.environ.get("TIDEMQ_PURE_PYTHON") == "1"

IMPLEMENTATION = "python"
encode_block = py_encode_block
check_message = py_check_message
block_results = py_block_results
decode_records = py_decode_records
make_msg_id = py_make_msg_id
if _c is not None and not _FORCE_PURE:
    IMPLEMENTATION = "c"
    encode_block = _c.encode_block
    check_message = _c.check_message
    block_results = _c.block_results
    decode_records = _c.decode_records
    make_msg_id = _c.make_msg_id
if TYPE_CHECKING:  # the twins have one interface: the pure one's annotations type both
    BlockBuilder = PyBlockBuilder
    RecordRef = PyRecordRef
else:
    BlockBuilder = PyBlockBuilder
    RecordRef = PyRecordRef
    if IMPLEMENTATION == "c":
        BlockBuilder = _c.BlockBuilder
        RecordRef = _c.RecordRef
