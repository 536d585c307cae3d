"""A receive's answer, encoded as it is built.

Each message is converted and encoded once (``to_proto``, as a pull does) and framed by hand as
a ``ReceivedMessage`` of a ``ReceiveMessageResponse``: building ``ReceivedMessage`` objects
around the converted messages would copy every message and its body again, and costs the
broker as much CPU per message as the rest of the receive. The framing is protobuf's wire
format (field key, varint length, bytes), which every parser reads as the generated message.
"""

from __future__ import annotations

from tidemq.services.broker.convert import to_proto
from tidemq.services.broker.receive.handle import HandleWriter
from tidemq.services.broker.receive.reading import PROP_MESSAGE_GROUP
from tidemq.storage import StoredMessage

# Keys of ReceiveMessageResponse.messages (1) and ReceivedMessage's fields, length-delimited
# (wire type 2) or varint (wire type 0).
_MESSAGES = b"\x0a"
_MESSAGE = b"\x0a"
_RECEIPT_HANDLE = b"\x12"
_DELIVERY_ATTEMPT = b"\x18"
_INVISIBLE_UNTIL_MS = b"\x20"
_MESSAGE_GROUP = b"\x2a"


def varint(v: int) -> bytes:
    """Protobuf's varint of ``v`` (>= 0)."""
    if v < 0x80:
        return bytes((v,))
    if v < 0x4000:
        return bytes(((v & 0x7F) | 0x80, v >> 7))
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class ReceiveAnswer:
    """The ``ReceiveMessageResponse`` of one receive, on the wire (``encoded``)."""

    __slots__ = ("_handle_key", "_parts", "_tails", "_until", "count", "handles", "redelivered")

    def __init__(self, handles: HandleWriter, invisible_until_ms: int) -> None:
        self.handles = handles
        self._until = invisible_until_ms
        # Every handle of one writer has the same length.
        self._handle_key = _RECEIPT_HANDLE + varint(handles.text_size)
        # By delivery attempt: the fields after the handle but the message group.
        self._tails: dict[int, bytes] = {}
        self._parts: list[bytes] = []
        self.count = 0
        self.redelivered = 0

    def add(self, m: StoredMessage, offset: int, attempt: int, lease_id: int) -> None:
        """``m``, the message at ``offset`` of its queue, delivered for the ``attempt``-th time
        under ``lease_id``."""
        proto = to_proto(m)
        # RocketMQ's reconsume times: deliveries before this one.
        proto.reconsume_times = attempt - 1
        message = proto.SerializeToString()
        handle = self.handles.encode(m.queue_id, offset, lease_id, self._until).encode()
        tail = self._tails.get(attempt)
        if tail is None:
            tail = self._tails[attempt] = (
                _DELIVERY_ATTEMPT
                + varint(attempt)
                + (_INVISIBLE_UNTIL_MS + varint(self._until) if self._until else b"")
            )
        fields = [_MESSAGE, varint(len(message)), message, self._handle_key, handle, tail]
        group = m.properties.get(PROP_MESSAGE_GROUP)
        if group:
            raw = group.encode()
            fields += (_MESSAGE_GROUP, varint(len(raw)), raw)
        body = b"".join(fields)
        self._parts += (_MESSAGES, varint(len(body)), body)
        self.count += 1
        if attempt > 1:
            self.redelivered += 1

    @property
    def encoded(self) -> bytes:
        return b"".join(self._parts)
