"""A broker's leaf znode in ZooKeeper: what it says and how it is kept ours.

The leaf (path and bytes: ``tidemq.services.nameserver.zk_format``) names the broker, its
addresses, role and epoch; its topics live in shard znodes (``zk_topic_shards``). ``sync_znode``
makes an ephemeral znode hold given bytes under this session, or says why it cannot: another
session holds it (``ZnodeHeldElsewhereError``), or it changed under every attempt
(``ZnodeRaceError``). ``zk_registration`` decides when to call it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from tidemq.protos import nameserver_pb2
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import broker_info, topic_protos
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import BrokerRegistration
from tidemq.services.nameserver.servicer import registration_from_wire

SYNC_ATTEMPTS = 3  # create/set races lost in a row before an attempt counts as failed


class ZnodeHeldElsewhereError(Exception):
    """Our znode's path is held by another session; a watch is set on it."""

    def __init__(self, path: str, owner: int) -> None:
        super().__init__(f"znode {path} is held by ZooKeeper session 0x{owner:x}")
        self.path = path
        self.owner = owner


class ZnodeRaceError(Exception):
    """The znode changed under every attempt of one sync; it is retried later."""


@dataclass(frozen=True)
class LeafTarget:
    """Where the broker registers and what its leaf says (no topics: they go in shards)."""

    path: str
    shard_dir: str
    registration: BrokerRegistration


class Synced(enum.Enum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def broker_registration(
    config: BrokerConfig, topics: TopicManager, role: RoleState
) -> BrokerRegistration:
    """What the broker registers: its heartbeat's content, held to the nameserver's rules
    (``ServiceError`` when it breaks them)."""
    request = nameserver_pb2.RegisterBrokerRequest(
        broker=broker_info(config, topics, role), topics=topic_protos(topics)
    )
    return registration_from_wire(request)


def leaf_target(config: BrokerConfig, topics: TopicManager, role: RoleState) -> LeafTarget:
    """Where the broker registers and its leaf's content, without reading every topic."""
    broker_id = role.registered_id
    request = nameserver_pb2.RegisterBrokerRequest(broker=broker_info(config, topics, role))
    return LeafTarget(
        zk_format.node_path(config.zk_root, config.cluster, config.broker_name, broker_id),
        zk_format.shard_dir(config.zk_root, config.cluster, config.broker_name, broker_id),
        registration_from_wire(request),
    )


def sync_znode(
    client: Any, path: str, data: bytes, watch: Callable[[Any], None], timeout_s: float
) -> Synced:
    """Make the ephemeral znode at ``path`` hold ``data`` under ``client``'s session.

    Leaves ``watch`` on the znode. Raises ZnodeHeldElsewhereError, ZnodeRaceError or a kazoo
    error (connection lost, timeout).
    """
    client_id = client.client_id
    if client_id is None:
        raise ConnectionLoss("not connected to ZooKeeper")
    session = client_id[0]
    for _ in range(SYNC_ATTEMPTS):
        stat = client.exists_async(path, watch=watch).get(timeout=timeout_s)
        if stat is None:
            try:
                client.create_async(path, data, ephemeral=True, makepath=True).get(
                    timeout=timeout_s
                )
            except NodeExistsError:
                continue  # created meanwhile, maybe by our own earlier create: look again
            except NoNodeError:
                # makepath makes every parent below the chroot, never the chroot itself.
                raise NoNodeError(
                    f"cannot create {path}: the chroot of the ZooKeeper hosts string must exist"
                ) from None
            return Synced.CREATED
        if stat.ephemeralOwner != session:
            raise ZnodeHeldElsewhereError(path, stat.ephemeralOwner)
        current, stat = client.get_async(path).get(timeout=timeout_s)
        if current == data:
            return Synced.UNCHANGED
        try:
            client.set_async(path, data, version=stat.version).get(timeout=timeout_s)
        except (BadVersionError, NoNodeError):
            continue  # someone else wrote or deleted it between our read and our write
        return Synced.UPDATED
    raise ZnodeRaceError(f"znode {path} changed under {SYNC_ATTEMPTS} attempts in a row")
