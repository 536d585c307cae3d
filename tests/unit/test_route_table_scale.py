"""The route table at 100,000 topics: incremental registrations cost what changed, and
nameservers fed the same registrations converge whatever each missed.

No sockets and no clocks: registrations are built here, as the servicer builds them from the
wire, and applied to tables directly.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    BrokerRole,
    DataVersion,
    FullRegistrationNeededError,
    TopicDelta,
    TopicQueues,
)
from tidemq.services.nameserver.route_table import RouteTable

TOPICS = 100_000


def _master(
    group: str, address: str, version: int, topics: tuple[TopicQueues, ...] = ()
) -> BrokerRegistration:
    return BrokerRegistration(
        cluster="c",
        broker_name=group,
        broker_id=0,
        address=address,
        ha_address=address,
        role=BrokerRole.SYNC_MASTER,
        epoch=0,
        data_version=DataVersion(0, version, 0),
        topics=topics,
    )


def _queues(name: str, n: int = 4) -> TopicQueues:
    return TopicQueues(name, n, n, 6)


class Broker:
    """A broker's topic table with a change log, as TopicManager keeps one."""

    def __init__(self, group: str, address: str) -> None:
        self.group = group
        self.address = address
        self.topics: dict[str, TopicQueues] = {}
        self.version = 0
        self.log: list[tuple[int, str]] = []

    def change(self, topic: str, queues: int | None) -> None:
        if queues is None:
            self.topics.pop(topic, None)
        else:
            self.topics[topic] = _queues(topic, queues)
        self.version += 1
        self.log.append((self.version, topic))

    def full(self) -> BrokerRegistration:
        return _master(self.group, self.address, self.version, tuple(self.topics.values()))

    def delta(self, base: int) -> BrokerRegistration:
        touched = {t for v, t in self.log if v > base}
        return replace(
            _master(
                self.group,
                self.address,
                self.version,
                tuple(self.topics[t] for t in sorted(touched) if t in self.topics),
            ),
            delta=TopicDelta(
                DataVersion(0, base, 0),
                tuple(sorted(t for t in touched if t not in self.topics)),
            ),
        )


class Nameserver:
    """A route table and the version it last accepted from each broker, as a broker's
    registration loop tracks per nameserver."""

    def __init__(self) -> None:
        self.table = RouteTable()
        self.accepted: dict[str, int] = {}
        self.deltas = 0
        self.fulls = 0

    def register(self, broker: Broker, now_ms: int) -> None:
        base = self.accepted.get(broker.address)
        if base is not None:
            try:
                self.table.register(broker.delta(base), now_ms)
            except FullRegistrationNeededError:
                pass
            else:
                self.deltas += 1
                self.accepted[broker.address] = broker.version
                return
        self.table.register(broker.full(), now_ms)
        self.fulls += 1
        self.accepted[broker.address] = broker.version

    def view(self) -> dict[str, tuple[tuple[str, int, int, int], ...]]:
        out = {}
        for topic in self.table.topics():
            route = self.table.route(topic)
            assert route is not None
            out[topic] = tuple(
                (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queues
            )
        return out


def _expected(brokers: list[Broker]) -> dict[str, tuple[tuple[str, int, int, int], ...]]:
    by_topic: dict[str, list[tuple[str, int, int, int]]] = {}
    for b in sorted(brokers, key=lambda b: b.group):
        for t in b.topics.values():
            by_topic.setdefault(t.topic, []).append(
                (b.group, t.read_queue_nums, t.write_queue_nums, t.perm)
            )
    return {topic: tuple(v) for topic, v in by_topic.items()}


def test_100k_topics_with_churn_converge_on_two_nameservers_that_each_missed_rounds() -> None:
    rng = random.Random(27)
    brokers = [Broker(f"broker-{c}", f"10.0.0.{i + 1}:10911") for i, c in enumerate("abcd")]
    for i in range(TOPICS):
        brokers[i % len(brokers)].change(f"t{i:06d}", 4)
    # A topic served by two groups, as a cluster-wide topic is.
    for b in brokers[:2]:
        b.change("shared", 8)
    one, two = Nameserver(), Nameserver()
    for b in brokers:
        one.register(b, 0)
        two.register(b, 0)
    assert one.view() == two.view() == _expected(brokers)

    names = [f"t{i:06d}" for i in range(TOPICS)]
    for round_no in range(1, 41):
        for _ in range(50):
            b = rng.choice(brokers)
            topic = rng.choice(names)
            owner = brokers[int(topic[1:]) % len(brokers)]
            if owner is b:
                b.change(topic, None if rng.random() < 0.5 else rng.choice((1, 4, 16)))
            else:
                b.change(f"new-{b.group}-{rng.randrange(10**9)}", 2)
        for b in brokers:
            one.register(b, round_no)
            if rng.random() < 0.7:  # the second nameserver misses about a third of the rounds
                two.register(b, round_no)
    for b in brokers:
        two.register(b, 100)
    assert one.view() == two.view() == _expected(brokers)
    # Every heartbeat after the first was incremental: nothing asked for a full registration.
    assert one.fulls == two.fulls == len(brokers)
    assert sum(len(b.topics) for b in brokers) > TOPICS * 0.7


def test_an_incremental_registration_touches_only_what_changed() -> None:
    broker = Broker("broker-a", "10.0.0.1:10911")
    for i in range(TOPICS):
        broker.change(f"t{i:06d}", 4)
    ns = Nameserver()
    ns.register(broker, 0)
    base = broker.version
    broker.change("t000007", None)
    broker.change("fresh", 2)
    reg = broker.delta(base)
    # What goes over the wire is the change, not the table.
    assert [t.topic for t in reg.topics] == ["fresh"]
    assert reg.delta is not None and reg.delta.removed == ("t000007",)
    ns.register(broker, 1)
    assert ns.table.route("t000007") is None
    route = ns.table.route("fresh")
    assert route is not None and route.queues[0].write_queue_nums == 2
    assert ns.table.topic_count() == TOPICS
    assert ns.table.data_version("10.0.0.1:10911") == DataVersion(0, broker.version, 0)


def test_a_delta_on_a_base_the_nameserver_does_not_hold_changes_nothing() -> None:
    broker = Broker("broker-a", "10.0.0.1:10911")
    for i in range(10):
        broker.change(f"t{i}", 4)
    table = RouteTable()
    table.register(broker.full(), 0)
    before = {t: table.route(t) for t in table.topics()}
    broker.change("t1", None)
    not_held = broker.version
    broker.change("t2", None)
    # The nameserver missed the round that carried t1: a delta based on it is refused.
    with pytest.raises(FullRegistrationNeededError):
        table.register(broker.delta(not_held), 1)
    assert {t: table.route(t) for t in table.topics()} == before
    # A broker this table never saw is refused too, rather than registered without topics.
    stranger = Broker("broker-b", "10.0.0.2:10911")
    with pytest.raises(FullRegistrationNeededError):
        table.register(stranger.delta(0), 1)
    assert table.lookup("10.0.0.2:10911") is None


def test_a_delta_from_an_address_that_changed_identity_needs_a_full_registration() -> None:
    broker = Broker("broker-a", "10.0.0.1:10911")
    broker.change("t", 4)
    table = RouteTable()
    table.register(broker.full(), 0)
    promoted_elsewhere = replace(broker.delta(broker.version), broker_name="broker-z")
    with pytest.raises(FullRegistrationNeededError):
        table.register(promoted_elsewhere, 1)
    route = table.route("t")
    assert route is not None and route.queues[0].broker_name == "broker-a"


def test_a_heartbeat_with_no_changes_keeps_every_route() -> None:
    broker = Broker("broker-a", "10.0.0.1:10911")
    for i in range(1000):
        broker.change(f"t{i}", 4)
    table = RouteTable()
    table.register(broker.full(), 0)
    heartbeat = broker.delta(broker.version)
    assert heartbeat.topics == () and heartbeat.delta is not None and not heartbeat.delta.removed
    table.register(heartbeat, 30_000)
    assert table.topic_count() == 1000
    # The heartbeat refreshed liveness: an expiry at 100 s after it keeps the broker.
    assert table.expire(100_000, 120_000) == []


def test_each_broker_reports_the_topics_it_registered_a_slave_behind_its_master_too() -> None:
    # What tidemq.testing's wait_synced and the console compare: a slave that has not yet
    # copied its master's topics (config sync) must say so, whatever its group routes.
    master = Broker("broker-a", "10.0.0.1:10911")
    for i in range(100):
        master.change(f"t{i}", 4)
    slave = Broker("broker-a", "10.0.0.2:10911")
    for i in range(60):
        slave.change(f"t{i}", 4)
    ns = Nameserver()
    ns.register(master, 0)
    slave_reg = replace(slave.full(), broker_id=1, role=BrokerRole.SLAVE)
    ns.table.register(slave_reg, 0)
    base = slave.version
    for i in range(60, 100):
        slave.change(f"t{i}", 4)
    slave.change("t0", None)
    ns.table.register(replace(slave.delta(base), broker_id=1, role=BrokerRole.SLAVE), 1)

    def counts() -> dict[int, int]:
        [cluster] = ns.table.cluster_info()
        return {b.registration.broker_id: b.topics for b in cluster.brokers}

    assert counts() == {0: 100, 1: 99}
    # The routes are the master's alone.
    assert ns.table.route("t0") is not None
    ns.table.note_topic_changes("10.0.0.2:10911", [_queues("t0")], [])
    assert counts() == {0: 100, 1: 100}
