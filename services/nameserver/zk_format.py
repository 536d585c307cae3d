"""The ZooKeeper registry's layout and znode format: what brokers write and nameservers read.

Pure: no connection to ZooKeeper, so every rule here is unit-tested without a server. Brokers
(``tidemq.services.broker.zk_registration``) encode, nameservers
(``tidemq.services.nameserver.zk_routes``) decode; this module owns the format.

Layout
------
::

    <root>/clusters/<cluster>/<broker_name>/<broker_id>

- ``<root>`` is ``--zk-root`` (default ``/tidemq``), below the chroot of the hosts string if it
  has one. Brokers create ``<root>`` and below on demand; a chroot must exist already (ZooKeeper
  clients never create their chroot).
- ``<broker_id>`` is the id in decimal without sign or leading zeros: ``0`` is the master.
- The leaf is an **ephemeral** znode owned by the broker's own ZooKeeper session, so it lives
  exactly as long as the broker's session. Nameservers refuse a persistent leaf: it would keep a
  dead broker in the routes forever.
- The parents are persistent. Brokers create them on demand and nobody deletes them: an empty
  group node costs nothing, and deleting it would race a broker creating its leaf.

Data, format 1
--------------
A JSON object in UTF-8 (the writer emits ASCII only, keys sorted, no whitespace, so equal
registrations are equal bytes), at most ``MAX_DATA_BYTES``::

    {"address": "10.0.0.1:10911",        Broker service host:port clients connect to
     "broker_id": 0,                      the same as in the path
     "broker_name": "broker-a",           the same as in the path
     "cluster": "DefaultCluster",         the same as in the path
     "data_version": {"counter": 3, "state_version": 0, "timestamp_ms": 1700000000000},
     "epoch": 0,                          the master epoch the broker serves under
     "format": 1,
     "ha_address": "",                    host:port slaves replicate from; "" when none
     "rocketmq_address": "10.0.0.1:8081", optional: the RocketMQ 5 (v2) listener, when served
     "role": "SYNC_MASTER",               ASYNC_MASTER | SYNC_MASTER | SLAVE
     "topics": [{"perm": 6, "read_queue_nums": 8, "topic": "orders", "write_queue_nums": 8}]}

Integers are JSON integers (``true`` or ``8.0`` are refused). Readers:

- refuse a znode whose ``format`` is not 1: a newer writer means something they would misread;
- ignore keys they do not know, so a writer may add optional keys within format 1;
- hold the content to exactly the rules of a RegisterBroker heartbeat
  (``servicer.registration_from_wire``: names of 1-127 of ``[A-Za-z0-9._-]``, broker id 0 if
  and only if the role is a master role, addresses, topics, queue counts, permissions), and
  require the identity in the data to equal the path, so a znode copied to the wrong place is
  refused rather than served under the wrong name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tidemq.protos import common_pb2, nameserver_pb2
from tidemq.services.errors import ServiceError
from tidemq.services.nameserver.route_table import BrokerRegistration, BrokerRole
from tidemq.services.nameserver.servicer import parse_host_port, registration_from_wire

FORMAT = 1
DEFAULT_ROOT = "/tidemq"
DEFAULT_ZK_PORT = 2181
# ZooKeeper refuses a packet over jute.maxbuffer (1 MiB - 1 by default) by closing the
# connection, which a writer would see as an endless ConnectionLoss. Stay clear of it, leaving
# room for the path and the request header. About 10,000 topics per broker fit.
MAX_DATA_BYTES = 1_000_000
CLUSTERS = "clusters"

DEFAULT_SESSION_TIMEOUT_MS = 10_000
SESSION_TIMEOUT_MIN_MS = 1_000
SESSION_TIMEOUT_MAX_MS = 600_000

_COMPONENT_RE = re.compile(r"^[A-Za-z0-9._-]+\Z")
_BROKER_ID_RE = re.compile(r"^(0|[1-9][0-9]{0,18})\Z")
ROOT_MAX_CHARS = 512


class ZooKeeperConfigError(ValueError):
    """A hosts string, root path, name or session timeout that ZooKeeper cannot take."""


class ZnodeDataError(ValueError):
    """Znode content (or a znode name) that is not a valid broker registration."""


@dataclass(frozen=True)
class BrokerNodeName:
    """Where a broker's znode is: the identity its path spells."""

    cluster: str
    broker_name: str
    broker_id: int


# -- layout -----------------------------------------------------------------------------------


def check_root(path: str) -> str:
    """``path`` if it can be the registry's root znode; ZooKeeperConfigError otherwise."""
    if not path.startswith("/"):
        raise ZooKeeperConfigError(f"root {path!r} must be an absolute path like /tidemq")
    if len(path) > ROOT_MAX_CHARS:
        raise ZooKeeperConfigError(f"root {path[:40]!r}... is longer than {ROOT_MAX_CHARS}")
    if path == "/":
        return path
    parts = path[1:].split("/")
    for part in parts:
        _check_component(f"root {path!r}", part)
    if parts[0] == "zookeeper":
        raise ZooKeeperConfigError(f"root {path!r}: /zookeeper is ZooKeeper's own subtree")
    return path


def check_hosts(hosts: str) -> str:
    """``hosts`` if it is a ZooKeeper connect string, ``HOST[:PORT][,HOST[:PORT]...][/chroot]``
    (port 2181 when left out, IPv6 hosts in brackets); ZooKeeperConfigError otherwise."""
    servers, slash, chroot = hosts.partition("/")
    if not servers:
        raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: no HOST:PORT given")
    if slash:
        try:
            check_root(slash + chroot)
        except ZooKeeperConfigError as e:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: chroot: {e}") from None
    for entry in servers.split(","):
        if not entry:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: an empty entry")
        with_port = entry
        if entry.endswith("]") or ":" not in entry:
            with_port = f"{entry}:{DEFAULT_ZK_PORT}"
        try:
            parse_host_port(with_port)
        except ValueError as e:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: {e}") from None
    return hosts


def check_session_timeout_ms(value: int) -> int:
    """``value`` if it can be asked for as a session timeout; ZooKeeperConfigError otherwise."""
    if not SESSION_TIMEOUT_MIN_MS <= value <= SESSION_TIMEOUT_MAX_MS:
        raise ZooKeeperConfigError(
            f"ZooKeeper session timeout must be in [{SESSION_TIMEOUT_MIN_MS}, "
            f"{SESSION_TIMEOUT_MAX_MS}] ms, got {value} (the server further clamps it to "
            "[2, 20] x its tickTime)"
        )
    return value


def parse_auth(text: str) -> tuple[str, str]:
    """``digest:USER:PASSWORD``, or ``@PATH`` of a file holding it (a mounted Secret): the
    ZooKeeper digest identity a broker writes its znodes as (docs/security.md)."""
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise ZooKeeperConfigError(
                f"zk_auth file {path!r}: cannot read it: {e.strerror}"
            ) from None
    scheme, _, credential = text.partition(":")
    user, sep, password = credential.partition(":")
    if scheme != "digest" or not sep or not user or not password:
        raise ZooKeeperConfigError("zk_auth must be digest:USER:PASSWORD (or @FILE holding it)")
    return user, password


def clusters_path(root: str) -> str:
    return join(root, CLUSTERS)


def join(parent: str, child: str) -> str:
    return f"{parent.rstrip('/')}/{child}"


def node_path(root: str, cluster: str, broker_name: str, broker_id: int) -> str:
    """The path of one broker's znode; ZooKeeperConfigError for a name ZooKeeper cannot hold."""
    for what, name in (("cluster", cluster), ("broker name", broker_name)):
        _check_component(what, name)
    if broker_id < 0:
        raise ZooKeeperConfigError(f"broker id must be >= 0, got {broker_id}")
    return join(join(join(clusters_path(root), cluster), broker_name), str(broker_id))


def parse_node_name(cluster: str, broker_name: str, broker_id: str) -> BrokerNodeName:
    """The identity a leaf's path spells; ZnodeDataError when the id is not a canonical id."""
    if not _BROKER_ID_RE.match(broker_id):
        raise ZnodeDataError(f"znode name {broker_id!r} is not a broker id (0, 1, 2, ...)")
    return BrokerNodeName(cluster, broker_name, int(broker_id))


def _check_component(what: str, name: str) -> None:
    # "." and ".." pass the name rules but are not znode names to ZooKeeper.
    if not _COMPONENT_RE.match(name) or name in (".", ".."):
        raise ZooKeeperConfigError(
            f"{what}: {name!r} is not a znode name of letters, digits, '.', '_' and '-'"
        )


# -- data -------------------------------------------------------------------------------------


def encode_registration(reg: BrokerRegistration) -> bytes:
    """Format 1 bytes for ``reg`` (already valid: it comes through the heartbeat rules)."""
    doc = {
        "format": FORMAT,
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
        "topics": [
            {
                "topic": t.topic,
                "read_queue_nums": t.read_queue_nums,
                "write_queue_nums": t.write_queue_nums,
                "perm": t.perm,
            }
            for t in sorted(reg.topics, key=lambda t: t.topic)
        ],
    }
    if reg.rocketmq_address:
        # Optional within format 1 (readers ignore keys they do not know): brokers without a
        # v2 listener write the same bytes as before.
        doc["rocketmq_address"] = reg.rocketmq_address
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(data) > MAX_DATA_BYTES:
        raise ZnodeDataError(
            f"registration of {reg.broker_name}/{reg.broker_id} is {len(data)} bytes "
            f"({len(reg.topics)} topics), over the {MAX_DATA_BYTES}-byte znode limit"
        )
    return data


def decode_registration(node: BrokerNodeName, data: bytes) -> BrokerRegistration:
    """The registration in a broker's znode at ``node``; ZnodeDataError says what is wrong."""
    if len(data) > MAX_DATA_BYTES:
        raise ZnodeDataError(f"{len(data)} bytes, over the {MAX_DATA_BYTES}-byte limit")
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
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != FORMAT:
        raise ZnodeDataError(f"format {fmt!r} is not {FORMAT} (written by a newer broker?)")

    role_name = _text(doc, "role")
    if role_name not in BrokerRole.__members__:
        raise ZnodeDataError(
            f"role {role_name!r} is not one of {', '.join(BrokerRole.__members__)}"
        )
    dv = _object(doc, "data_version")
    topics = doc.get("topics")
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
    return reg


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
