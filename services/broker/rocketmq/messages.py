"""Between v2 ``Message``s and ours: a client's message as our ``common_pb2.Message`` (its id as
``UNIQ_KEY``, its message group as the sharding key, a delivery time as ``deliver_at_ms``, a
GZIP body inflated), and a stored or received message as the v2 ``Message`` the clients read
(id, type, timestamps, hosts, tag, keys, group, attempt, handle, MD5 body digest). Pure."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2
from tidemq.services.broker.rocketmq.status import StatusError
from tidemq.storage.record import PROP_TIMER_DELIVER_MS, PROP_UNIQ_KEY

C = definition_pb2

PROP_MESSAGE_GROUP = "__SHARDINGKEY"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_DLQ_ORIGIN_TOPIC = "RETRY_TOPIC"
PROP_DLQ_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
# RocketMQ's PROPERTY_TRACE_CONTEXT: where the proxy stores SystemProperties.trace_context (a
# W3C traceparent, set by the clients' OpenTelemetry instrumentation) and reads it back from;
# tidemq's SDK writes and reads the same property (docs/operations.md, "Tracing").
PROP_TRACE_CONTEXT = "TRACE_CONTEXT"
MAX_TRACE_CONTEXT_CHARS = 512
# Our system properties: neither a client's user property may name them, nor are they shown
# as user properties (tags, keys, ids, groups, timers, transactions, dead letters, idempotence).
SYSTEM_PROPERTIES = frozenset(
    {
        "TAGS",
        "KEYS",
        PROP_UNIQ_KEY,
        PROP_MESSAGE_GROUP,
        PROP_TIMER_DELIVER_MS,
        PROP_TRAN_MSG,
        PROP_TRACE_CONTEXT,
        "PGROUP",
        "REAL_TOPIC",
        "REAL_QID",
        "PRODUCER_SEQ",
        PROP_DLQ_ORIGIN_TOPIC,
        PROP_DLQ_ORIGIN_MESSAGE_ID,
        "DLQ_ORIGIN_QUEUE_ID",
        "DLQ_ORIGIN_QUEUE_OFFSET",
        "DLQ_DELIVERY_ATTEMPTS",
        "DLQ_REASON",
        "DLQ_TIME_MS",
        "DLQ_DROPPED_PROPERTIES",
    }
)
MAX_MESSAGE_ID_CHARS = 128
MAX_MESSAGE_GROUP_CHARS = 128


@dataclass(frozen=True)
class Outgoing:
    """One message of a v2 send, as our send path takes it."""

    message: common_pb2.Message
    message_id: str  # the client's id ("" when it gave none: ours is answered)
    message_type: int  # definition_pb2.MessageType
    message_group: str


def _ms(ts: timestamp_pb2.Timestamp) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


_MAX_MS = 2**63 - 1  # what an int64 field of milliseconds holds


def _ms_field(ts: timestamp_pb2.Timestamp, what: str, code: int) -> int:
    """``ts`` in milliseconds, or ``code`` when they do not fit a millisecond field (a Timestamp
    holds seconds up to 2^63, a thousand times more)."""
    ms = _ms(ts)
    if ms > _MAX_MS:
        raise StatusError(code, f"{what} is out of range ({ts.seconds} s)")
    return ms


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _body(m: definition_pb2.Message, max_body_bytes: int) -> bytes:
    sp = m.system_properties
    body = m.body
    if sp.body_encoding == C.GZIP:
        inflate = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
        try:
            body = inflate.decompress(body, max_body_bytes + 1)
        except zlib.error as e:
            raise StatusError(C.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {e}") from None
        if len(body) > max_body_bytes:
            raise StatusError(
                C.MESSAGE_BODY_TOO_LARGE,
                f"the inflated body is over the broker's {max_body_bytes}-byte limit",
            )
        if not inflate.eof:
            raise StatusError(C.MESSAGE_CORRUPTED, "the GZIP body is truncated")
    elif sp.body_encoding not in (C.IDENTITY, C.ENCODING_UNSPECIFIED):
        raise StatusError(C.BAD_REQUEST, f"unknown body_encoding {sp.body_encoding}")
    given = sp.body_digest if sp.HasField("body_digest") else None
    checked = given is not None and given.type != C.DIGEST_TYPE_UNSPECIFIED
    if checked and digest(given.type, m.body) != given.checksum.upper():  # type: ignore[union-attr]
        raise StatusError(C.MESSAGE_CORRUPTED, "the body does not match its body_digest")
    return bytes(body)


def digest(kind: int, body: bytes) -> str:
    """Uppercase hex, as the clients compare it."""
    if kind == C.CRC32:
        return f"{zlib.crc32(body):08X}"
    if kind == C.MD5:
        return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()
    if kind == C.SHA1:
        return hashlib.sha1(body, usedforsecurity=False).hexdigest().upper()
    raise StatusError(C.BAD_REQUEST, f"unknown body_digest type {kind}")


def _check_text(what: str, value: str, limit: int, code: int) -> None:
    if len(value) > limit or any(ord(ch) < 0x20 for ch in value):
        raise StatusError(code, f"{what} must be at most {limit} printable characters")


def to_ours(m: definition_pb2.Message, max_body_bytes: int) -> Outgoing:
    """A client's message as our ``common_pb2.Message`` (queue not chosen yet); StatusError
    for what the protocol refuses. Limits of size and names are the send path's own checks."""
    sp = m.system_properties
    if not m.topic.name:
        raise StatusError(C.ILLEGAL_TOPIC, "message topic.name is required")
    body = _body(m, max_body_bytes)
    if not body:
        raise StatusError(C.MESSAGE_BODY_EMPTY, "the message body is empty")
    props = dict(m.user_properties)
    for key in props:
        if key in SYSTEM_PROPERTIES or key.startswith("__") or not key:
            raise StatusError(
                C.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"user property {key!r} is reserved for the system properties",
            )
    out = common_pb2.Message(topic=m.topic.name, body=body)
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise StatusError(C.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is blank or contains '|'")
        out.tag = sp.tag
    for key in sp.keys:
        if not key.strip():
            raise StatusError(C.ILLEGAL_MESSAGE_KEY, "a message key is blank")
    out.keys.extend(sp.keys)
    if sp.message_id:
        _check_text("message_id", sp.message_id, MAX_MESSAGE_ID_CHARS, C.ILLEGAL_MESSAGE_ID)
        props[PROP_UNIQ_KEY] = sp.message_id
    kind = sp.message_type or C.NORMAL
    group = sp.message_group if sp.HasField("message_group") else ""
    if group:
        _check_text("message_group", group, MAX_MESSAGE_GROUP_CHARS, C.ILLEGAL_MESSAGE_GROUP)
        props[PROP_MESSAGE_GROUP] = group
    delivery = sp.HasField("delivery_timestamp")
    if kind not in (C.NORMAL, C.FIFO, C.DELAY, C.TRANSACTION):
        raise StatusError(
            C.UNSUPPORTED,
            f"message type {kind} is not supported (NORMAL, FIFO, DELAY and TRANSACTION are)",
        )
    if (kind == C.FIFO) != bool(group):
        raise StatusError(
            C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a FIFO message has a message_group, and only a FIFO message has one",
        )
    if (kind == C.DELAY) != delivery:
        raise StatusError(
            C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a DELAY message has a delivery_timestamp, and only a DELAY message has one",
        )
    if delivery:
        deliver_at_ms = _ms_field(
            sp.delivery_timestamp, "delivery_timestamp", C.ILLEGAL_DELIVERY_TIME
        )
        if deliver_at_ms <= 0:
            raise StatusError(C.ILLEGAL_DELIVERY_TIME, "delivery_timestamp must be after 1970")
        out.deliver_at_ms = deliver_at_ms
    if sp.HasField("born_timestamp"):
        born_ms = _ms_field(sp.born_timestamp, "born_timestamp", C.BAD_REQUEST)
        out.born_timestamp_ms = max(0, born_ms)
    trace_context = sp.trace_context if sp.HasField("trace_context") else ""
    if trace_context and _printable(trace_context, MAX_TRACE_CONTEXT_CHARS):
        # Tracing never fails a send (as the proxy, which does not check it): a value that
        # could not be stored as a property is dropped instead.
        props[PROP_TRACE_CONTEXT] = trace_context
    if props:
        out.properties.update(props)
    return Outgoing(out, sp.message_id, kind, group)


def _printable(value: str, limit: int) -> bool:
    return len(value) <= limit and all(ord(ch) >= 0x20 for ch in value)


def message_type_of(props: Mapping[str, str]) -> int:
    """The type a stored message was sent as (a committed transaction's copy is NORMAL)."""
    if PROP_TRAN_MSG in props:
        return int(C.TRANSACTION)
    if PROP_MESSAGE_GROUP in props:
        return int(C.FIFO)
    if PROP_TIMER_DELIVER_MS in props:
        return int(C.DELAY)
    return int(C.NORMAL)


def stored_to_v2(m: common_pb2.StoredMessage) -> definition_pb2.Message:
    """A stored message as the clients read it (no receipt handle)."""
    props = m.properties
    out = definition_pb2.Message(topic=C.Resource(name=m.topic), body=m.body)
    sp = out.system_properties
    sp.message_id = props.get(PROP_UNIQ_KEY) or m.msg_id
    sp.message_type = message_type_of(props)
    if m.tag:
        sp.tag = m.tag
    sp.keys.extend(m.keys)
    sp.born_timestamp.CopyFrom(_timestamp(m.born_timestamp_ms))
    sp.born_host = m.born_host.rpartition(":")[0].strip("[]") or m.born_host
    sp.store_timestamp.CopyFrom(_timestamp(m.store_timestamp_ms))
    sp.store_host = m.store_host
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    sp.body_encoding = C.IDENTITY
    sp.body_digest.type = C.MD5
    sp.body_digest.checksum = digest(C.MD5, m.body)
    group = props.get(PROP_MESSAGE_GROUP)
    if group:
        sp.message_group = group
    deliver = props.get(PROP_TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(_timestamp(int(deliver)))
    trace_context = props.get(PROP_TRACE_CONTEXT)
    if trace_context:
        sp.trace_context = trace_context
    origin = props.get(PROP_DLQ_ORIGIN_TOPIC)
    if origin and m.topic.startswith("%DLQ%"):
        sp.dead_letter_queue.topic = origin
        sp.dead_letter_queue.message_id = props.get(PROP_DLQ_ORIGIN_MESSAGE_ID, "")
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES and not k.startswith("__")}
    if user:
        out.user_properties.update(user)
    return out


def received_to_v2(r: broker_pb2.ReceivedMessage) -> definition_pb2.Message:
    """A received message with its receipt handle and delivery attempt."""
    out = stored_to_v2(r.message)
    sp = out.system_properties
    sp.receipt_handle = r.receipt_handle
    sp.delivery_attempt = r.delivery_attempt
    if r.message_group:
        sp.message_group = r.message_group
    return out
