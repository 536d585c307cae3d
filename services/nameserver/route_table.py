"""The nameserver's route table (RocketMQ's ``RouteInfoManager``) as pure state.

No I/O, no asyncio, no gRPC: the caller passes the clock in (``now_ms``) and owns concurrency.
The embedded registry drives one table from one asyncio loop, so nothing here locks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tidemq.services.nameserver.route_model import (
    MASTER_ID,
    BrokerData,
    BrokerLive,
    BrokerRef,
    BrokerRegistration,
    ClusterInfo,
    ClusterMismatchError,
    DataVersion,
    FullRegistrationNeededError,
    MasterAddresses,
    QueueData,
    StaleEpochError,
    TopicDelta,
    TopicQueues,
    TopicRoute,
)


@dataclass
class _Group:
    cluster: str
    broker_name: str
    epoch: int  # the highest epoch any accepted registration of this group carried
    members: dict[int, str] = field(default_factory=dict)  # broker id -> address
    topics: set[str] = field(default_factory=set)  # topics this group has queue data for


@dataclass
class _Live:
    registration: BrokerRegistration
    last_update_ms: int
    # The topics this broker registered (a slave's too, though only a master's are routed):
    # how far each broker's config has come is what operators and tests compare.
    topics: set[str] = field(default_factory=set)


class RouteTable:
    """Which broker groups serve which topic, fed by broker registrations.

    Rules (RocketMQ's RouteInfoManager, spec §6.1, with the epoch fencing of apache/rocketmq#6316):

    - A group's queue data for its topics comes only from its master's registration (id 0).
      A full registration carries the broker's whole topic set and replaces its group's queue
      data; an incremental one (``TopicDelta``) carries what changed since a data version the
      table holds for that broker, and is applied as it is, so a heartbeat costs what changed,
      not what the broker holds. An incremental registration on any other base changes nothing
      and raises ``FullRegistrationNeededError``. Topics from a slave's registration are
      ignored.
    - A group's queue data stays while any member of the group is alive, so consumers can still
      read from slaves when the master is gone; it goes when the last member leaves.
    - A registration from a known address refreshes its last-update time. An address that shows
      up under another (group, id) moves there: a slave promoted to master leaves id 1 for id 0.
    - When a second address claims an id, the newer registration takes it and the displaced
      address leaves the table, except that a claim of id 0 with an epoch below the group's epoch
      is refused (``StaleEpochError``) and that address leaves the table: an old master coming
      back must never displace, or be served beside, the newer one. Equal epochs (classic
      master/slave, where every epoch is 0) let the newest claim win, as in RocketMQ.
    - A group's epoch is the highest epoch any accepted registration of the group carried (a
      slave reports the epoch of the master it follows). It is kept while any member is alive,
      so an old master is fenced even after its successor has gone silent, as long as the group
      still has a member; RocketMQ compares only with a live id-0 holder.

    Invariants, true after every public call:

    - every address belongs to exactly one (group, id), and every (group, id) to one address;
    - every group has at least one member (a group whose last member leaves is deleted);
    - every topic has queue data from at least one group, and every group named in a topic's
      queue data exists: so every route lists at least one live broker per group it names;
    - a group keeps one cluster for its whole life.
    """

    def __init__(self) -> None:
        self._live: dict[str, _Live] = {}  # address -> latest registration and its time
        self._groups: dict[str, _Group] = {}  # broker name -> group
        self._queues: dict[str, dict[str, QueueData]] = {}  # topic -> broker name -> queue data

    # -- changes -----------------------------------------------------------------------------

    def register(self, reg: BrokerRegistration, now_ms: int) -> MasterAddresses:
        """Record a heartbeat; answers the group's master addresses.

        Raises ``ClusterMismatchError`` or ``FullRegistrationNeededError`` (table untouched),
        or ``StaleEpochError`` (the stale address has been removed from the table).
        """
        if reg.delta is not None:
            self._check_base(reg, reg.delta)
        group = self._groups.get(reg.broker_name)
        if group is not None and group.cluster != reg.cluster:
            raise ClusterMismatchError(
                f"broker group {reg.broker_name!r} belongs to cluster {group.cluster!r}, "
                f"not {reg.cluster!r}"
            )
        if group is not None and reg.broker_id == MASTER_ID and reg.epoch < group.epoch:
            self._remove_address(reg.address)
            raise StaleEpochError(reg, group.epoch, group.members.get(MASTER_ID, ""))

        previous = self._live.get(reg.address)
        if previous is not None:
            old = previous.registration
            if (old.broker_name, old.broker_id) != (reg.broker_name, reg.broker_id):
                if old.broker_name == reg.broker_name:
                    # Same group, new id (a slave promoted to master): vacate the old id without
                    # the group-deletion cascade, since this address is about to rejoin it.
                    assert group is not None
                    del group.members[old.broker_id]
                else:
                    self._remove_address(reg.address)

        if group is None:
            group = self._groups[reg.broker_name] = _Group(reg.cluster, reg.broker_name, reg.epoch)
        displaced = group.members.get(reg.broker_id)
        if displaced is not None and displaced != reg.address:
            del self._live[displaced]
        group.members[reg.broker_id] = reg.address
        group.epoch = max(group.epoch, reg.epoch)

        if reg.broker_id == MASTER_ID:
            if reg.delta is None:
                self._set_queue_data(group, reg.topics)
            else:
                self._change_queue_data(group, reg.topics, reg.delta.removed)
        # Topics live in the group's queue data; keeping them here too would double the memory.
        if reg.delta is None:
            own = {t.topic for t in reg.topics}
        else:
            assert previous is not None  # _check_base found it
            own = previous.topics
            _change_names(own, reg.topics, reg.delta.removed)
        # Topics live in the group's queue data and as names here; the registration as given
        # would hold every topic a second time.
        self._live[reg.address] = _Live(replace(reg, topics=(), delta=None), now_ms, own)
        return self._master_of(group)

    def apply_topic_changes(
        self, address: str, upserted: Iterable[TopicQueues], removed: Iterable[str]
    ) -> bool:
        """Topics created, changed or deleted on a registered broker, for registries that learn
        of topics apart from registrations (ZooKeeper's topic shards). Applied, and True, when
        ``address`` is its group's master, or a slave of a group without one (see
        ``serve_reads_from_slave``); otherwise the table is left alone."""
        upserted, removed = list(upserted), list(removed)
        live = self._live.get(address)
        if live is None:
            return False
        _change_names(live.topics, upserted, removed)
        reg = live.registration
        group = self._groups[reg.broker_name]
        master = group.members.get(MASTER_ID)
        if master != address and (master is not None or reg.broker_id == MASTER_ID):
            return False
        self._change_queue_data(group, upserted, removed)
        return True

    def note_topic_changes(
        self, address: str, upserted: Iterable[TopicQueues], removed: Iterable[str]
    ) -> None:
        """Topic changes of a broker whose topics are not routed (a slave, as ZooKeeper's
        shards tell them): only the count of its own topics follows."""
        live = self._live.get(address)
        if live is not None:
            _change_names(live.topics, upserted, removed)

    def serve_reads_from_slave(self, reg: BrokerRegistration) -> None:
        """Queue data from a registered slave's topics, for a group that has no master.

        The embedded table keeps what the departed master registered; a table rebuilt from a
        snapshot (the ZooKeeper registry) has only the slaves' copies of the master's topics
        (config sync), and without them consumers could not read from the slaves. A group with a
        master, or a registration that is not the registered slave, is left alone.
        """
        group = self._groups.get(reg.broker_name)
        if (
            group is None
            or MASTER_ID in group.members
            or group.members.get(reg.broker_id) != reg.address
        ):
            return
        self._set_queue_data(group, reg.topics)

    def unregister(self, cluster: str, broker_name: str, broker_id: int, address: str) -> bool:
        """Remove a broker that is shutting down; False when no such broker is registered.

        Only the exact (cluster, group, id, address) is removed, so the shutdown of an address
        that has already been displaced cannot take its successor out of the routes.
        """
        live = self._live.get(address)
        if live is None:
            return False
        reg = live.registration
        if (reg.cluster, reg.broker_name, reg.broker_id) != (cluster, broker_name, broker_id):
            return False
        self._remove_address(address)
        return True

    def expire(self, now_ms: int, timeout_ms: int) -> list[BrokerRef]:
        """Remove every broker silent for longer than ``timeout_ms``; returns those removed."""
        silent = [
            _ref(live.registration)
            for live in self._live.values()
            if live.last_update_ms + timeout_ms < now_ms
        ]
        for ref in silent:
            self._remove_address(ref.address)
        return sorted(silent, key=lambda r: (r.cluster, r.broker_name, r.broker_id))

    # -- queries -----------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRoute | None:
        """The groups serving ``topic``, or None when none does."""
        by_group = self._queues.get(topic)
        if not by_group:
            return None
        names = sorted(by_group)
        return TopicRoute(
            topic=topic,
            queues=[by_group[name] for name in names],
            brokers=[self._broker_data(self._groups[name]) for name in names],
        )

    def cluster_info(self) -> list[ClusterInfo]:
        """Every live group and broker, grouped by cluster (sorted by name throughout)."""
        clusters: dict[str, list[_Group]] = {}
        for group in self._groups.values():
            clusters.setdefault(group.cluster, []).append(group)
        result = []
        for cluster in sorted(clusters):
            groups = sorted(clusters[cluster], key=lambda g: g.broker_name)
            brokers = []
            for group in groups:
                for broker_id in sorted(group.members):
                    live = self._live[group.members[broker_id]]
                    brokers.append(
                        BrokerLive(live.registration, live.last_update_ms, len(live.topics))
                    )
            result.append(ClusterInfo(cluster, [self._broker_data(g) for g in groups], brokers))
        return result

    def lookup(self, address: str) -> BrokerRef | None:
        """Which broker ``address`` currently is, if it is registered."""
        live = self._live.get(address)
        return None if live is None else _ref(live.registration)

    def broker_count(self) -> int:
        return len(self._live)

    def topics(self) -> list[str]:
        """Every topic some group serves, sorted."""
        return sorted(self._queues)

    def topic_count(self) -> int:
        return len(self._queues)

    def data_version(self, address: str) -> DataVersion | None:
        """The topic data version of the broker at ``address``'s latest registration."""
        live = self._live.get(address)
        return None if live is None else live.registration.data_version

    # -- internals ---------------------------------------------------------------------------

    def _check_base(self, reg: BrokerRegistration, delta: TopicDelta) -> None:
        live = self._live.get(reg.address)
        held = None if live is None else live.registration
        if held is None or (held.cluster, held.broker_name, held.broker_id) != (
            reg.cluster,
            reg.broker_name,
            reg.broker_id,
        ):
            raise FullRegistrationNeededError(f"{reg.address} is not registered here as it says")
        if held.data_version != delta.base_version:
            raise FullRegistrationNeededError(
                f"{reg.address}: this nameserver holds topic data version {held.data_version}, "
                f"not {delta.base_version}"
            )

    def _remove_address(self, address: str) -> None:
        live = self._live.pop(address, None)
        if live is None:
            return
        reg = live.registration
        group = self._groups[reg.broker_name]
        if group.members.get(reg.broker_id) == address:
            del group.members[reg.broker_id]
        if not group.members:
            self._set_queue_data(group, ())
            del self._groups[reg.broker_name]

    def _set_queue_data(self, group: _Group, topics: tuple[TopicQueues, ...]) -> None:
        wanted = {t.topic: t for t in topics}
        for topic in group.topics - wanted.keys():
            by_group = self._queues[topic]
            del by_group[group.broker_name]
            if not by_group:
                del self._queues[topic]  # a topic with no groups left disappears
        for t in wanted.values():
            self._queues.setdefault(t.topic, {})[group.broker_name] = QueueData(
                group.broker_name, t.read_queue_nums, t.write_queue_nums, t.perm
            )
        group.topics = set(wanted)

    def _change_queue_data(
        self, group: _Group, upserted: Iterable[TopicQueues], removed: Iterable[str]
    ) -> None:
        for topic in removed:
            if topic not in group.topics:
                continue
            group.topics.discard(topic)
            by_group = self._queues[topic]
            del by_group[group.broker_name]
            if not by_group:
                del self._queues[topic]
        for t in upserted:
            self._queues.setdefault(t.topic, {})[group.broker_name] = QueueData(
                group.broker_name, t.read_queue_nums, t.write_queue_nums, t.perm
            )
            group.topics.add(t.topic)

    def _master_of(self, group: _Group) -> MasterAddresses:
        address = group.members.get(MASTER_ID)
        if address is None:
            return MasterAddresses("", "")
        return MasterAddresses(address, self._live[address].registration.ha_address)

    def _broker_data(self, group: _Group) -> BrokerData:
        ha = {}
        v2 = {}
        for broker_id, address in group.members.items():
            registration = self._live[address].registration
            if registration.ha_address:
                ha[broker_id] = registration.ha_address
            if registration.rocketmq_address:
                v2[broker_id] = registration.rocketmq_address
        return BrokerData(
            cluster=group.cluster,
            broker_name=group.broker_name,
            addresses=dict(sorted(group.members.items())),
            ha_addresses=dict(sorted(ha.items())),
            epoch=group.epoch,
            rocketmq_addresses=dict(sorted(v2.items())),
        )


def _ref(reg: BrokerRegistration) -> BrokerRef:
    return BrokerRef(reg.cluster, reg.broker_name, reg.broker_id, reg.address)


def _change_names(names: set[str], upserted: Iterable[TopicQueues], removed: Iterable[str]) -> None:
    names.difference_update(removed)
    names.update(t.topic for t in upserted)
