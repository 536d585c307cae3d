"""The values the SDK hands to and gets from applications."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tidemq.protos import broker_pb2


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

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


@dataclass(frozen=True)
class Message:
    """A message to send. ``sharding_key``: messages with the same key go to the same queue, so
    a consumer sees them in the order they were sent."""

    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] | None = None
    sharding_key: str | None = None


@dataclass(frozen=True)
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
        }
