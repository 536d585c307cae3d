"""The values the SDK hands to and gets from applications."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from tidemq.protos import broker_pb2

# RocketMQ 5's property for a message's message group (its sharding key): FIFO delivery per
# message group, and the producer routes a group to one queue.
MESSAGE_GROUP_PROPERTY = "__SHARDINGKEY"


class SendStatus(enum.Enum):
    """RocketMQ's send statuses. Anything but SEND_OK means the message IS stored on the master
    but not yet as durable as the broker's settings ask (disk flush or slave replication)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


# The wire's numbers for these statuses, from the generated enum (same names).
_WIRE_STATUS = {broker_pb2.SendStatus.Value(s.name): s for s in SendStatus}


def send_status(wire: int) -> SendStatus:
    try:
        return _WIRE_STATUS[wire]
    except KeyError:
        raise ValueError(f"unknown send status {wire} from broker") from None


class SendResult(NamedTuple):
    """What the broker answered for one message. A NamedTuple (immutable, like the frozen
    dataclass it was): the producer builds one per message, and a frozen dataclass cost more to
    construct than the rest of the message's handling in the SDK."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    broker: str  # the broker group (broker name)
    topic: str = ""
    commitlog_offset: int = 0
    # The master epoch that acknowledged (automatic failover; 0 in classic master/slave), and
    # the address of the broker that answered.
    epoch: int = 0
    broker_address: str = ""
    # A transactional send's id (``Transaction.send``): what checks and ends refer to.
    transaction_id: str = ""
    # A delayed message (``send(deliver_at=...)``): the handle ``recall`` takes while it is
    # pending, and when it becomes visible (the broker's clock, ms). queue_offset is -1: its
    # place in the queue is known at delivery.
    recall_handle: str = ""
    deliver_at_ms: int = 0
    # An idempotent producer's retry the broker had stored already: the fields above are
    # that first store's (msg_id may be empty when it is too old to be remembered in full).
    duplicate: bool = False

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


@dataclass(frozen=True)
class Message:
    """A message to send. ``message_group`` (``sharding_key`` is the same thing under its older
    name): messages of one group go to the same queue, so a consumer sees them in the order they
    were sent, and a FIFO receive group gets each only after the group's earlier ones were
    acknowledged. It travels as the ``__SHARDINGKEY`` property (RocketMQ 5's)."""

    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] | None = None
    sharding_key: str | None = None
    message_group: str | None = None
    # Delayed delivery, as ``Producer.send``'s options of the same names (at most one).
    deliver_at: dt.datetime | int | None = None
    delay: dt.timedelta | float | None = None
    delay_level: int | None = None

    def __post_init__(self) -> None:
        group = message_group_of(self.message_group, self.sharding_key)
        object.__setattr__(self, "message_group", group)
        object.__setattr__(self, "sharding_key", group)


def message_group_of(message_group: str | None, sharding_key: str | None) -> str | None:
    """The one message group named by either spelling; both given must agree."""
    if message_group is not None and sharding_key is not None and message_group != sharding_key:
        raise ValueError(
            f"message_group {message_group!r} and sharding_key {sharding_key!r} differ: they are"
            " one setting (sharding_key is the older name), give one"
        )
    return message_group if message_group is not None else sharding_key


class ConsumeResult(enum.Enum):
    """What a ``PushConsumer`` listener answers for a message (RocketMQ 5's names): SUCCESS
    acknowledges it; FAILURE (or an exception) gives it back for a retry after the group's
    backoff."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


def _fill(obj: object, **values: Any) -> None:
    """Set a slotted frozen instance's fields without its __init__ (decoders, from_received)."""
    setters = _SLOT_SETTERS
    for name, value in values.items():
        setters[name](obj, value)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    msg_id: str
    born_timestamp_ms: int
    store_timestamp_ms: int
    broker: str
    commitlog_offset: int = 0
    born_host: str = ""
    store_host: str = ""
    reconsume_times: int = 0
    # Receive/ack consumption (SimpleConsumer, PushConsumer); unset for pulled messages.
    # The handle that acks, nacks or changes this delivery; change_invisible_duration replaces
    # it in place (as RocketMQ's clients do), so it is left out of equality and hashing.
    receipt_handle: str = field(default="", compare=False)
    delivery_attempt: int = 0  # 1 on the first delivery
    message_group: str | None = None
    # Wall-clock ms (the broker's clock) when the invisibility, and with it the handle, ends.
    invisible_until_ms: int = field(default=0, compare=False)

    @classmethod
    def from_received(cls, r: Any, broker: str) -> ReceivedMessage:
        """From a ``ReceiveMessageResponse`` entry: the stored message and its delivery."""
        m = r.message
        # Built by filling the slots through their own setters: the frozen dataclass's __init__
        # sets each of its 19 fields through object.__setattr__, which was most of the SDK's
        # cost per received message. Same fields, same values, same class.
        obj = object.__new__(cls)
        _fill(
            obj,
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            body=m.body,
            tag=m.tag or None,
            keys=tuple(m.keys) if m.keys else (),
            properties=dict(m.properties) if m.properties else {},
            msg_id=m.msg_id,
            born_timestamp_ms=m.born_timestamp_ms,
            store_timestamp_ms=m.store_timestamp_ms,
            broker=broker,
            commitlog_offset=m.commitlog_offset,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
            receipt_handle=r.receipt_handle,
            delivery_attempt=r.delivery_attempt,
            message_group=r.message_group or None,
            invisible_until_ms=r.invisible_until_ms,
        )
        return obj

    def renew(self, receipt_handle: str, invisible_until_ms: int) -> None:
        """The new handle of a changed invisibility (the old one stopped working). The rest of
        the message stays a value; only the delivery's handle moves on."""
        object.__setattr__(self, "receipt_handle", receipt_handle)
        object.__setattr__(self, "invisible_until_ms", invisible_until_ms)

    @classmethod
    def from_proto(cls, m: Any, broker: str) -> ReceivedMessage:
        return cls(
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            body=m.body,
            tag=m.tag or None,
            keys=tuple(m.keys),
            properties=dict(m.properties),
            msg_id=m.msg_id,
            born_timestamp_ms=m.born_timestamp_ms,
            store_timestamp_ms=m.store_timestamp_ms,
            broker=broker,
            commitlog_offset=m.commitlog_offset,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (the body as text when it is UTF-8, else hex)."""
        try:
            body: str = self.body.decode()
            encoding = "utf-8"
        except UnicodeDecodeError:
            body, encoding = self.body.hex(), "hex"
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "broker": self.broker,
            "msg_id": self.msg_id,
            "tag": self.tag,
            "keys": list(self.keys),
            "properties": self.properties,
            "born_timestamp_ms": self.born_timestamp_ms,
            "store_timestamp_ms": self.store_timestamp_ms,
            "body": body,
            "body_encoding": encoding,
            **(
                {
                    "delivery_attempt": self.delivery_attempt,
                    "message_group": self.message_group,
                    "invisible_until_ms": self.invisible_until_ms,
                    "receipt_handle": self.receipt_handle,
                }
                if self.receipt_handle
                else {}
            ),
        }


# Each field's slot setter: what ``_fill`` sets a ReceivedMessage's fields with.
_SLOT_SETTERS: dict[str, Callable[[object, Any], None]] = {
    f.name: getattr(ReceivedMessage, f.name).__set__ for f in fields(ReceivedMessage)
}
