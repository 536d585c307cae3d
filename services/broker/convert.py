"""Between protobuf messages and the broker's own types: stored messages, topic configs and the
broker's identity as it registers. No I/O."""

from __future__ import annotations

import ipaddress
from typing import Any

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.idempotence.stamp import PRODUCER_SEQ_PROPERTY
from tidemq.services.broker.receive.dead_letter import is_system_topic
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import DataVersion, TopicConfig, TopicManager
from tidemq.services.errors import invalid
from tidemq.storage import Message, PutStatus, StoredMessage
from tidemq.storage.config import parse_host
from tidemq.storage.record import make_msg_id

_NOT_PROPERTIES = frozenset(("TAGS", "KEYS", PRODUCER_SEQ_PROPERTY))

SEND_STATUS = {
    PutStatus.PUT_OK: broker_pb2.SEND_OK,
    PutStatus.FLUSH_DISK_TIMEOUT: broker_pb2.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: broker_pb2.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: broker_pb2.SLAVE_NOT_AVAILABLE,
}


_host_strs: dict[tuple[bytes, int], str] = {}


def host_str(host: tuple[bytes, int]) -> str:
    # Every pulled message names two hosts, and a broker sees few distinct ones: formatting
    # through ipaddress each time was a sixth of the pull path's CPU.
    text = _host_strs.get(host)
    if text is None:
        ip = ipaddress.ip_address(host[0])
        text = f"[{ip}]:{host[1]}" if ip.version == 6 else f"{ip}:{host[1]}"
        if len(_host_strs) >= 4096:
            _host_strs.clear()
        _host_strs[host] = text
    return text


def peer_host(peer: str) -> tuple[bytes, int]:
    """The born host of a sender, from gRPC's peer string ("ipv4:127.0.0.1:5555" or
    "ipv6:[::1]:5555"); 0.0.0.0:0 for a peer that has no address (a unix socket)."""
    _, _, rest = peer.partition(":")
    try:
        return parse_host(rest)
    except Exception:  # noqa: BLE001 - any peer we cannot parse is recorded as 0.0.0.0
        return (bytes(4), 0)


def to_store_message(m: common_pb2.Message, born_host: tuple[bytes, int]) -> Message:
    # Most messages carry no properties: skip building and scanning an empty map.
    props = dict(m.properties) if m.properties else {}
    for reserved in ("TAGS", "KEYS") if props else ():
        if reserved in props:
            raise invalid(
                f"property {reserved} is set by the tag and keys fields",
                common_pb2.INVALID_PROPERTY,
            )
    return Message(
        topic=m.topic,
        body=m.body,
        queue_id=m.queue_id,
        tags=m.tag or None,
        keys=tuple(m.keys) if m.keys else (),
        properties=props,
        flag=m.flag,
        born_timestamp_ms=m.born_timestamp_ms,
        born_host=born_host,
    )


def to_proto(m: StoredMessage) -> common_pb2.StoredMessage:
    props = m.properties
    out = common_pb2.StoredMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        commitlog_offset=m.phy_offset,
        size=m.size,
        body=m.body,
        tag=props.get("TAGS", ""),
        msg_id=make_msg_id(m.store_host, m.phy_offset),
        born_timestamp_ms=m.born_timestamp_ms,
        store_timestamp_ms=m.store_timestamp_ms,
        born_host=host_str(m.born_host),
        store_host=host_str(m.store_host),
        reconsume_times=m.reconsume_times,
        flag=m.flag,
    )
    # Repeated and map fields are set only when there is something in them: handing the
    # constructor an empty list or dict costs as much as half the message.
    if "KEYS" in props:
        out.keys.extend(m.keys)
    # PRODUCER_SEQ is the broker's (idempotent sends), kept from consumers like TAGS and KEYS.
    if len(props) > ("TAGS" in props) + ("KEYS" in props) + (PRODUCER_SEQ_PROPERTY in props):
        out.properties.update({k: v for k, v in props.items() if k not in _NOT_PROPERTIES})
    return out


def parse_tag_expression(expr: str) -> list[str] | None:
    """``"*"`` or empty -> None (everything); ``"a || b"`` -> ["a", "b"]."""
    expr = expr.strip()
    if not expr or expr == "*":
        return None
    tags = [t.strip() for t in expr.split("||")]
    if any(not t or "*" in t for t in tags):
        raise invalid(f"bad tag expression {expr!r}", common_pb2.INVALID_TAG_EXPRESSION)
    return tags


def topic_proto(t: TopicConfig) -> Any:
    return common_pb2.TopicConfig(
        topic=t.topic,
        read_queue_nums=t.read_queue_nums,
        write_queue_nums=t.write_queue_nums,
        perm=t.perm,
        order=t.order,
        attributes=t.attributes,
    )


def topic_protos(topics: TopicManager) -> list[Any]:
    """The topics a broker publishes (routes) and lists: its own logs (%SYS%) are not for
    clients."""
    return [topic_proto(t) for t in topics.all() if not is_system_topic(t.topic)]


def broker_info(
    config: BrokerConfig, topics: TopicManager, role: RoleState, version: DataVersion | None = None
) -> Any:
    """What a registration says of the broker; ``version`` is the topic data version it
    registers (the table's current one by default)."""
    dv = version or topics.data_version
    return common_pb2.BrokerInfo(
        identity=common_pb2.BrokerIdentity(
            cluster=config.cluster, broker_name=config.broker_name, broker_id=role.registered_id
        ),
        address=config.advertised,
        # Masters serve replication on the Broker service's own port; slaves serve none.
        ha_address=config.advertised if role.is_master else "",
        rocketmq_address=config.rocketmq_advertised,
        role=common_pb2.BrokerRole.Value(role.role.value),
        epoch=role.epoch,
        data_version=common_pb2.DataVersion(
            state_version=dv.state_version, counter=dv.counter, timestamp_ms=dv.timestamp_ms
        ),
    )
