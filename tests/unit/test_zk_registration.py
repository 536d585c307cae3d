"""The broker's side of the ZooKeeper registry without ZooKeeper: what it registers, the config
that says where, and ``sync_znode``'s decisions against a scripted client."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from tidemq.services.broker.config import BrokerConfig, BrokerRole
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.broker.zk_leaf import (
    Synced,
    ZnodeHeldElsewhereError,
    ZnodeRaceError,
    broker_registration,
    sync_znode,
)
from tidemq.services.broker.zk_registration import ZkRegistration
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import BrokerRole as WireRole
from tidemq.services.nameserver.route_model import TopicQueues
from tidemq.storage.errors import ConfigError

pytestmark = pytest.mark.unit

PATH = "/tidemq/clusters/DefaultCluster/broker-a/0"
OURS = 0xA
THEIRS = 0xB


@dataclass
class Stat:
    version: int
    ephemeralOwner: int  # kazoo's ZnodeStat spells it so


@dataclass
class Answer:
    """kazoo's IAsyncResult, already settled."""

    value: Any = None
    error: Exception | None = None

    def get(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class FakeZk:
    """One znode and a session; ``before`` runs a scripted interference before a call."""

    session: int | None = OURS
    data: bytes | None = None
    owner: int = 0
    version: int = 0
    calls: list[str] = field(default_factory=list)
    watches: list[str] = field(default_factory=list)
    before: dict[str, list[Callable[[FakeZk], Exception | None]]] = field(default_factory=dict)

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        return None if self.session is None else (self.session, b"password")

    def _call(self, name: str) -> Exception | None:
        self.calls.append(name)
        script = self.before.get(name)
        return script.pop(0)(self) if script else None

    def exists_async(self, path: str, watch: Any = None) -> Answer:
        if watch is not None:
            self.watches.append(path)
        error = self._call("exists")
        stat = None if self.data is None else Stat(self.version, self.owner)
        return Answer(stat, error)

    def create_async(self, path: str, value: bytes, ephemeral: bool, makepath: bool) -> Answer:
        assert (path, ephemeral, makepath) == (PATH, True, True)
        error = self._call("create")
        if error is None and self.data is not None:
            error = NodeExistsError()
        if error is None:
            self.data, self.owner, self.version = value, self.session or 0, 0
        return Answer(PATH, error)

    def get_async(self, path: str) -> Answer:
        error = self._call("get")
        if error is None and self.data is None:
            error = NoNodeError()
        return Answer((self.data, Stat(self.version, self.owner)), error)

    def set_async(self, path: str, value: bytes, version: int) -> Answer:
        error = self._call("set")
        if error is None and version != self.version:
            error = BadVersionError()
        if error is None:
            self.data, self.version = value, self.version + 1
        return Answer(None, error)


def sync(zk: FakeZk, data: bytes = b"new") -> Synced:
    return sync_znode(zk, PATH, data, lambda event: None, timeout_s=1.0)


def test_a_missing_znode_is_created_under_our_session_with_a_watch() -> None:
    zk = FakeZk()
    assert sync(zk) is Synced.CREATED
    assert (zk.data, zk.owner, zk.watches) == (b"new", OURS, [PATH])


def test_our_znode_with_the_same_bytes_is_left_alone() -> None:
    zk = FakeZk(data=b"new", owner=OURS, version=3)
    assert sync(zk) is Synced.UNCHANGED
    assert zk.calls == ["exists", "get"]


def test_our_znode_with_other_bytes_is_set_at_the_version_read() -> None:
    zk = FakeZk(data=b"old", owner=OURS, version=3)
    assert sync(zk) is Synced.UPDATED
    assert (zk.data, zk.version) == (b"new", 4)


def test_a_create_that_finds_our_own_znode_settles_on_it() -> None:
    """A create retried after a lost answer: the first one had gone through."""

    def first_create_went_through(zk: FakeZk) -> Exception | None:
        zk.data, zk.owner = b"new", OURS
        return None  # the fake then answers NodeExistsError, as ZooKeeper would

    zk = FakeZk(before={"create": [first_create_went_through]})
    assert sync(zk) is Synced.UNCHANGED
    assert zk.calls == ["exists", "create", "exists", "get"]


def test_another_sessions_znode_is_waited_for_with_a_watch() -> None:
    zk = FakeZk(data=b"theirs", owner=THEIRS)
    with pytest.raises(ZnodeHeldElsewhereError, match="held by ZooKeeper session 0xb") as held:
        sync(zk)
    assert held.value.owner == THEIRS
    assert (zk.data, zk.watches) == (b"theirs", [PATH])


def test_a_write_that_loses_a_race_looks_again() -> None:
    def someone_wrote(zk: FakeZk) -> Exception | None:
        zk.version += 1
        return None

    zk = FakeZk(data=b"old", owner=OURS, before={"set": [someone_wrote]})
    assert sync(zk) is Synced.UPDATED
    assert zk.calls == ["exists", "get", "set", "exists", "get", "set"]


def test_endless_races_give_up_for_a_retry_later() -> None:
    def deleted_meanwhile(zk: FakeZk) -> Exception | None:
        error: Exception = NoNodeError()
        return error

    zk = FakeZk(data=b"old", owner=OURS, before={"set": [deleted_meanwhile] * 3})
    with pytest.raises(ZnodeRaceError):
        sync(zk)


def test_a_missing_chroot_is_named() -> None:
    def chroot_missing(zk: FakeZk) -> Exception | None:
        error: Exception = NoNodeError()
        return error

    zk = FakeZk(before={"create": [chroot_missing]})
    with pytest.raises(NoNodeError, match="chroot of the ZooKeeper hosts string must exist"):
        sync(zk)


def test_no_session_no_attempt() -> None:
    zk = FakeZk(session=None)
    with pytest.raises(ConnectionLoss):
        sync(zk)
    assert zk.calls == []


def test_connection_errors_reach_the_caller() -> None:
    def connection_lost(zk: FakeZk) -> Exception | None:
        error: Exception = ConnectionLoss()
        return error

    zk = FakeZk(before={"exists": [connection_lost]})
    with pytest.raises(ConnectionLoss):
        sync(zk)


# -- what and where the broker registers ------------------------------------------------------


def config(**changes: Any) -> BrokerConfig:
    return BrokerConfig(**{"store_dir": "/nonexistent/store", "zk_hosts": "zk1:2181", **changes})


def role_of(cfg: BrokerConfig) -> RoleState:
    return RoleState.for_config(cfg.role, cfg.broker_id, cfg.automatic, cfg.failover_lease_ms)


def test_the_znode_holds_the_heartbeats_content() -> None:
    topics = TopicManager("/nonexistent/store")
    topics.topics = {"orders": TopicConfig("orders", 4, 2, perm=4)}
    cfg = config(listen="10.0.0.1:10911", role=BrokerRole.SYNC_MASTER)
    reg = broker_registration(cfg, topics, role_of(cfg))
    assert (reg.cluster, reg.broker_name, reg.broker_id, reg.address, reg.role) == (
        "DefaultCluster",
        "broker-a",
        0,
        "10.0.0.1:10911",
        WireRole.SYNC_MASTER,
    )
    assert reg.topics == (TopicQueues("orders", 4, 2, 4),)
    data = zk_format.encode_registration(reg)
    node = zk_format.BrokerNodeName("DefaultCluster", "broker-a", 0)
    assert zk_format.decode_registration(node, data) == reg


def test_a_broker_no_nameserver_could_route_does_not_start() -> None:
    topics = TopicManager("/nonexistent/store")
    bad = config(broker_name="b" * 128)
    with pytest.raises(ConfigError, match=r"cannot register in ZooKeeper.*1-127"):
        ZkRegistration.for_broker(bad, topics, role_of(bad))
    cfg = config(zk_root="/mq", broker_id=0)
    registration = ZkRegistration.for_broker(cfg, topics, role_of(cfg))
    assert registration.path == "/mq/clusters/DefaultCluster/broker-a/0"


def test_under_automatic_failover_the_master_registers_as_id_0_with_its_epoch() -> None:
    topics = TopicManager("/nonexistent/store")
    cfg = config(failover="auto", broker_id=3, role=BrokerRole.SYNC_MASTER)
    role = role_of(cfg)
    registration = ZkRegistration.for_broker(cfg, topics, role)
    assert registration.path.endswith("/broker-a/3")  # a candidate registers as a slave
    assert broker_registration(cfg, topics, role).role == WireRole.SLAVE
    role.promote(epoch=4, sent_ms=0, gone_seen_ms=0)
    reg = broker_registration(cfg, topics, role)
    assert (reg.broker_id, reg.role, reg.epoch, reg.ha_address) == (
        0,
        WireRole.SYNC_MASTER,
        4,
        cfg.advertised,
    )
    role.demote(epoch=5, master_id=2)
    reg = broker_registration(cfg, topics, role)
    assert (reg.broker_id, reg.role, reg.epoch) == (3, WireRole.SLAVE, 5)


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"zk_hosts": "zk1:2181,"}, "an empty entry"),
        ({"zk_root": "mq"}, "absolute path"),
        ({"zk_session_timeout_ms": 500}, "session timeout"),
        ({"cluster": ".."}, "is not a znode name"),
        ({"broker_name": "a/b"}, "is not a znode name"),
    ],
)
def test_bad_zookeeper_settings_are_refused_at_once(
    changes: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint):
        config(**changes)


def test_names_are_only_checked_for_znodes_when_registering_in_zookeeper() -> None:
    without_zk = dataclasses.replace(config(), zk_hosts="", cluster="a/b")
    assert without_zk.zk_hosts == ""
