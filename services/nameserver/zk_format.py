"""The ZooKeeper registry's layout and znode format: what brokers write and nameservers read.

Pure: no connection to ZooKeeper, so every rule here is unit-tested without a server. Brokers
(``tidemq.services.broker.zk_registration``) encode, nameservers
(``tidemq.services.nameserver.zk_routes``) decode; this module owns the format.

Layout
------
::

    <root>/clusters/<cluster>/<broker_name>/<broker_id>                 the broker's leaf
    <root>/topics/<cluster>/<broker_name>/<broker_id>/<shard>           its topics, sharded

- ``<root>`` is ``--zk-root`` (default ``/tidemq``), below the chroot of the hosts string if it
  has one. Brokers create ``<root>`` and below on demand; a chroot must exist already (ZooKeeper
  clients never create their chroot).
- ``<broker_id>`` is the id in decimal without sign or leading zeros: ``0`` is the master.
- The leaf and the shards are **ephemeral** znodes owned by the broker's own ZooKeeper session,
  so they live exactly as long as the broker's session. Nameservers refuse a persistent leaf (it
  would keep a dead broker in the routes forever) and take a broker's topics only from shards
  owned by the session that owns its leaf.
- ``<shard>`` is ``shard_of(topic)``: the CRC-32 of the topic's UTF-8 name modulo ``SHARDS``
  (256), as two lowercase hex digits (``00``..``ff``). A topic's shard never changes, so creating
  or deleting one topic rewrites exactly one shard znode, whatever the broker holds. Only
  non-empty shards exist: a broker deletes a shard whose last topic goes.
- The parents are persistent. Brokers create them on demand and nobody deletes them: an empty
  group node costs nothing, and deleting it would race a broker creating its leaf.

Leaf data, format 2 (written) and format 1 (still read)
-------------------------------------------------------
A JSON object in UTF-8 (the writer emits ASCII only, keys sorted, no whitespace, so equal
registrations are equal bytes), at most ``MAX_DATA_BYTES``::

    {"address": "10.0.0.1:10911",        Broker service host:port clients connect to
     "broker_id": 0,                      the same as in the path
     "broker_name": "broker-a",           the same as in the path
     "cluster": "DefaultCluster",         the same as in the path
     "data_version": {"counter": 3, "state_version": 0, "timestamp_ms": 1700000000000},
     "epoch": 0,                          the master epoch the broker serves under
     "format": 2,
     "ha_address": "",                    host:port slaves replicate from; "" when none
     "rocketmq_address": "10.0.0.1:8081", optional: the RocketMQ 5 (v2) listener, when served
     "role": "SYNC_MASTER"}               ASYNC_MASTER | SYNC_MASTER | SLAVE

- Format 2 holds no topics (they are in the shards), so the leaf stays a few hundred bytes and
  is rewritten only when the broker's identity, addresses, role or epoch change. Its
  ``data_version`` is the topic data version when the leaf was last written, not the current
  one: bumping it on every topic change would rewrite the leaf every time.
- Format 1 (brokers before format 2) is the same object with ``"format": 1`` and the topics
  inline, ``"topics": [{"perm": 6, "read_queue_nums": 8, "topic": "orders",
  "write_queue_nums": 8}, ...]``; a format-1 broker writes no shards. Readers take both, so
  brokers can be upgraded one at a time.

Shard data, format 2
--------------------
``{"format": 2, "topics": [<topic object as above>, ...]}``, keys sorted, no whitespace, topics
sorted by name, each of them hashing to the shard's name. With ~75 bytes a topic, 256 shards and
a broker's topic limit of 200,000, a shard averages ~780 topics (~60 KB, ~150 KB with 127-byte
names), far below ``MAX_DATA_BYTES``; the writer still refuses a bigger one
(``ZnodeDataError``).

Integers are JSON integers (``true`` or ``8.0`` are refused). Readers:

- refuse a znode whose ``format`` they do not know: a newer writer means something they would
  misread;
- ignore keys they do not know, so a writer may add optional keys within a format;
- hold the content to exactly the rules of a RegisterBroker heartbeat
  (``servicer.registration_from_wire``: names of 1-127 of ``[A-Za-z0-9._-]``, broker id 0 if
  and only if the role is a master role, addresses, topics, queue counts, permissions), and
  require the identity in the data to equal the path (and each shard's topics to hash to its
  name), so a znode copied to the wrong place is refused rather than served under the wrong
  name.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from tidemq.protos import common_pb2, nameserver_pb2
from tidemq.services.errors import ServiceError
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    BrokerRole,
    DataVersion,
    TopicQueues,
)
from tidemq.services.nameserver.servicer import (
    _topic_queues,
    registration_from_wire,
)
from tidemq.services.nameserver.zk_settings import ZooKeeperConfigError, check_component

FORMAT = 2  # what writers write
INLINE_TOPICS_FORMAT = 1  # leaves with their topics inline, still read
# ZooKeeper refuses a packet over jute.maxbuffer (1 MiB - 1 by default) by closing the
# connection, which a writer would see as an endless ConnectionLoss. Stay clear of it, leaving
# room for the path and the request header. A shard holds 1/SHARDS of a broker's topics.
MAX_DATA_BYTES = 1_000_000
CLUSTERS = "clusters"
TOPICS = "topics"
SHARDS = 256


_BROKER_ID_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}\Z")


class ZnodeDataError(ValueError):
    """Znode content (or a znode name) that is not a valid broker registration."""


@dataclass(frozen=True)
class BrokerNodeName:
    """Where a broker's znode is: the identity its path spells."""

    cluster: str
    broker_name: str
    broker_id: int


@dataclass(frozen=True)
class Leaf:
    """A decoded leaf: the registration, with its topics only when ``inline`` (format 1)."""

    registration: BrokerRegistration
    inline: bool


# -- layout -----------------------------------------------------------------------------------


def clusters_path(root: str) -> str:
    return join(root, CLUSTERS)


def topics_path(root: str) -> str:
    return join(root, TOPICS)


def shard_of(topic: str) -> str:
    """The shard a topic's configuration lives in (stable: the layout depends on it)."""
    return f"{zlib.crc32(topic.encode('utf-8')) % SHARDS:02x}"


def shard_dir(root: str, cluster: str, broker_name: str, broker_id: int) -> str:
    """The parent of a broker's shard znodes (checked like ``node_path``)."""
    leaf = node_path(root, cluster, broker_name, broker_id)
    return join(topics_path(root), leaf[len(clusters_path(root)) + 1 :])


def check_shard_name(name: str) -> str:
    if not _SHARD_RE.match(name):
        raise ZnodeDataError(f"znode name {name!r} is not a shard (00, 01, ..., ff)")
    return name


def join(parent: str, child: str) -> str:
    return f"{parent.rstrip('/')}/{child}"


def node_path(root: str, cluster: str, broker_name: str, broker_id: int) -> str:
    """The path of one broker's znode; ZooKeeperConfigError for a name ZooKeeper cannot hold."""
    for what, name in (("cluster", cluster), ("broker name", broker_name)):
        check_component(what, name)
    if broker_id < 0:
        raise ZooKeeperConfigError(f"broker id must be >= 0, got {broker_id}")
    return join(join(join(clusters_path(root), cluster), broker_name), str(broker_id))


def parse_node_name(cluster: str, broker_name: str, broker_id: str) -> BrokerNodeName:
    """The identity a leaf's path spells; ZnodeDataError when the id is not a canonical id."""
    if not _BROKER_ID_RE.match(broker_id):
        raise ZnodeDataError(f"znode name {broker_id!r} is not a broker id (0, 1, 2, ...)")
    return BrokerNodeName(cluster, broker_name, int(broker_id))


# -- data -------------------------------------------------------------------------------------


def _leaf_doc(reg: BrokerRegistration, fmt: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": fmt,
        "cluster": reg.cluster,
        "broker_name": reg.broker_name,
        "broker_id": reg.broker_id,
        "address": reg.address,
        "ha_address": reg.ha_address,
        "role": reg.role.name,
        "epoch": reg.epoch,
        "data_version": {
            "state_version": reg.data_version.state_version,
            "counter": reg.data_version.counter,
            "timestamp_ms": reg.data_version.timestamp_ms,
        },
    }
    if reg.rocketmq_address:
        # Optional (readers ignore keys they do not know): brokers without a v2 listener write
        # the same bytes as before.
        doc["rocketmq_address"] = reg.rocketmq_address
    return doc


def _dump(doc: dict[str, Any], what: str) -> bytes:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(data) > MAX_DATA_BYTES:
        raise ZnodeDataError(
            f"{what} is {len(data)} bytes, over the {MAX_DATA_BYTES}-byte znode limit"
        )
    return data


def encode_leaf(reg: BrokerRegistration) -> bytes:
    """Format 2 leaf bytes for ``reg`` (already valid); its topics go to ``encode_shard``."""
    return _dump(_leaf_doc(reg, FORMAT), f"leaf of {reg.broker_name}/{reg.broker_id}")


def encode_registration(reg: BrokerRegistration) -> bytes:
    """Format 1 bytes for ``reg``, topics inline: what brokers before format 2 wrote."""
    doc = _leaf_doc(reg, INLINE_TOPICS_FORMAT)
    doc["topics"] = [_topic_doc(t) for t in sorted(reg.topics, key=lambda t: t.topic)]
    return _dump(
        doc, f"registration of {reg.broker_name}/{reg.broker_id} ({len(reg.topics)} topics)"
    )


def encode_shard(shard: str, topics: Iterable[TopicQueues]) -> bytes:
    """Shard bytes for ``topics`` (already valid, each of them in ``shard``)."""
    docs = [_topic_doc(t) for t in sorted(topics, key=lambda t: t.topic)]
    return _dump({"format": FORMAT, "topics": docs}, f"shard {shard} ({len(docs)} topics)")


def _topic_doc(t: TopicQueues) -> dict[str, Any]:
    return {
        "topic": t.topic,
        "read_queue_nums": t.read_queue_nums,
        "write_queue_nums": t.write_queue_nums,
        "perm": t.perm,
    }


def _load(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_DATA_BYTES:
        raise ZnodeDataError(f"{len(data)} bytes, over the {MAX_DATA_BYTES}-byte znode limit")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ZnodeDataError(f"not UTF-8: {e}") from None
    except ValueError as e:
        raise ZnodeDataError(f"not JSON: {e}") from None
    except RecursionError:
        raise ZnodeDataError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ZnodeDataError(f"not a JSON object but {type(doc).__name__}")
    return doc


def decode_registration(node: BrokerNodeName, data: bytes) -> BrokerRegistration:
    """The registration in a broker's leaf at ``node`` (no topics from a format-2 leaf: they
    are in its shards); ZnodeDataError says what is wrong."""
    return decode_leaf(node, data).registration


def decode_leaf(node: BrokerNodeName, data: bytes) -> Leaf:
    """A broker's leaf at ``node``, format 1 or 2; ZnodeDataError says what is wrong."""
    doc = _load(data)
    fmt = doc.get("format")
    if type(fmt) is not int or fmt not in (INLINE_TOPICS_FORMAT, FORMAT):
        raise ZnodeDataError(
            f"format {fmt!r} is not {INLINE_TOPICS_FORMAT} or {FORMAT} (written by a newer broker?)"
        )
    inline = fmt == INLINE_TOPICS_FORMAT
    role_name = _text(doc, "role")
    if role_name not in BrokerRole.__members__:
        raise ZnodeDataError(
            f"role {role_name!r} is not one of {', '.join(BrokerRole.__members__)}"
        )
    dv = _object(doc, "data_version")
    topics = doc.get("topics") if inline else []
    if not isinstance(topics, list):
        raise ZnodeDataError(f"topics must be a list, got {type(topics).__name__}")
    try:
        request = nameserver_pb2.RegisterBrokerRequest(
            broker=common_pb2.BrokerInfo(
                identity=common_pb2.BrokerIdentity(
                    cluster=_text(doc, "cluster"),
                    broker_name=_text(doc, "broker_name"),
                    broker_id=_integer(doc, "broker_id"),
                ),
                address=_text(doc, "address"),
                ha_address=_text(doc, "ha_address"),
                rocketmq_address=_text(doc, "rocketmq_address")
                if "rocketmq_address" in doc
                else "",
                role=int(BrokerRole[role_name]),
                epoch=_integer(doc, "epoch"),
                data_version=common_pb2.DataVersion(
                    state_version=_integer(dv, "state_version", "data_version."),
                    counter=_integer(dv, "counter", "data_version."),
                    timestamp_ms=_integer(dv, "timestamp_ms", "data_version."),
                ),
            ),
            topics=[_topic(i, t) for i, t in enumerate(topics)],
        )
    except (TypeError, ValueError) as e:  # an int beyond its field's range, a lone surrogate
        raise ZnodeDataError(f"a value the registration cannot hold: {e}") from None
    try:
        reg = registration_from_wire(request)
    except ServiceError as e:
        raise ZnodeDataError(str(e)) from None
    found = BrokerNodeName(reg.cluster, reg.broker_name, reg.broker_id)
    if found != node:
        raise ZnodeDataError(
            f"data names {found.cluster}/{found.broker_name}/{found.broker_id} but the znode is "
            f"{node.cluster}/{node.broker_name}/{node.broker_id}"
        )
    return Leaf(reg, inline)


def without_topics(reg: BrokerRegistration) -> BrokerRegistration:
    """What a format-2 leaf says of ``reg``, data version aside: a leaf is rewritten only
    when this changes."""
    return replace(reg, topics=(), delta=None, data_version=DataVersion())


def decode_shard(shard: str, data: bytes) -> dict[str, TopicQueues]:
    """The topics (by name) of the shard znode named ``shard``; ZnodeDataError if invalid."""
    check_shard_name(shard)
    doc = _load(data)
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != FORMAT:
        raise ZnodeDataError(f"shard format {fmt!r} is not {FORMAT} (written by a newer broker?)")
    topics = doc.get("topics")
    if not isinstance(topics, list):
        raise ZnodeDataError(f"topics must be a list, got {_kind(topics)}")
    found: dict[str, TopicQueues] = {}
    for i, value in enumerate(topics):
        if not isinstance(value, dict):
            raise ZnodeDataError(f"topics[{i}] is not an object")
        where = f"topics[{i}]."
        fields = SimpleNamespace(
            topic=_text(value, "topic", where),
            read_queue_nums=_integer(value, "read_queue_nums", where),
            write_queue_nums=_integer(value, "write_queue_nums", where),
            perm=_integer(value, "perm", where),
        )
        try:
            t = _topic_queues(i, fields)  # the heartbeat's own rules
        except ServiceError as e:
            raise ZnodeDataError(str(e)) from None
        if t.topic in found:
            raise ZnodeDataError(f"topic {t.topic!r} appears twice in one shard")
        if shard_of(t.topic) != shard:
            raise ZnodeDataError(f"topic {t.topic!r} belongs in shard {shard_of(t.topic)}")
        found[t.topic] = t
    return found


def _topic(i: int, value: Any) -> Any:
    if not isinstance(value, dict):
        raise ZnodeDataError(f"topics[{i}] is not an object")
    where = f"topics[{i}]."
    return common_pb2.TopicConfig(
        topic=_text(value, "topic", where),
        read_queue_nums=_integer(value, "read_queue_nums", where),
        write_queue_nums=_integer(value, "write_queue_nums", where),
        perm=_integer(value, "perm", where),
    )


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ZnodeDataError(f"{key} must be an object, got {_kind(value)}")
    return value


def _text(doc: dict[str, Any], key: str, where: str = "") -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ZnodeDataError(f"{where}{key} must be a string, got {_kind(value)}")
    return value


def _integer(doc: dict[str, Any], key: str, where: str = "") -> int:
    value = doc.get(key)
    if type(value) is not int:  # bool is an int to isinstance
        raise ZnodeDataError(f"{where}{key} must be an integer, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
