"""RouteTable against RocketMQ's RouteInfoManagerNewTest scenarios, plus random op sequences.

Each case is a script of steps and the route one topic must have at the end, written as
{broker name: (broker id -> address, (read queues, write queues))}. The clock is a number.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.services.nameserver.route_model import (
    BrokerRef,
    BrokerRegistration,
    BrokerRole,
    ClusterMismatchError,
    DataVersion,
    MasterAddresses,
    StaleEpochError,
    TopicQueues,
)
from tidemq.services.nameserver.route_table import RouteTable

pytestmark = pytest.mark.unit

TIMEOUT_MS = 120_000
MASTER_A = "10.0.0.1:10911"
SLAVE_A = "10.0.0.2:10911"
MASTER_B = "10.0.0.3:10911"


def reg(
    address: str,
    broker_id: int = 0,
    *,
    name: str = "broker-a",
    cluster: str = "DefaultCluster",
    epoch: int = 0,
    topics: tuple[str, ...] = ("TopicTest",),
    queues: int = 8,
) -> BrokerRegistration:
    host, port = address.rsplit(":", 1)
    return BrokerRegistration(
        cluster=cluster,
        broker_name=name,
        broker_id=broker_id,
        address=address,
        ha_address=f"{host}:{int(port) + 1}",
        role=BrokerRole.SYNC_MASTER if broker_id == 0 else BrokerRole.SLAVE,
        epoch=epoch,
        data_version=DataVersion(epoch, 1, 0),
        topics=tuple(TopicQueues(t, queues, queues, 6) for t in topics),
    )


@dataclass(frozen=True)
class Reg:
    registration: BrokerRegistration
    at_ms: int = 0
    stale: bool = False  # expect StaleEpochError


@dataclass(frozen=True)
class Unreg:
    address: str
    broker_id: int
    name: str = "broker-a"


@dataclass(frozen=True)
class Expire:
    at_ms: int
    removed: tuple[str, ...]  # addresses expected to go


Step = Reg | Unreg | Expire
Expected = dict[str, tuple[dict[int, str], tuple[int, int]]] | None


def run(table: RouteTable, steps: list[Step]) -> None:
    for step in steps:
        if isinstance(step, Reg):
            if step.stale:
                with pytest.raises(StaleEpochError):
                    table.register(step.registration, step.at_ms)
            else:
                table.register(step.registration, step.at_ms)
        elif isinstance(step, Unreg):
            assert table.unregister("DefaultCluster", step.name, step.broker_id, step.address)
        else:
            removed = table.expire(step.at_ms, TIMEOUT_MS)
            assert sorted(r.address for r in removed) == sorted(step.removed)


def observed(table: RouteTable, topic: str) -> Expected:
    route = table.route(topic)
    if route is None:
        return None
    assert [q.broker_name for q in route.queues] == [b.broker_name for b in route.brokers]
    return {
        b.broker_name: (b.addresses, (q.read_queue_nums, q.write_queue_nums))
        for q, b in zip(route.queues, route.brokers, strict=True)
    }


CASES: list[tuple[str, list[Step], Expected]] = [
    (
        "master and slave: both listed, queue data from the master",
        [Reg(reg(MASTER_A, 0, queues=8)), Reg(reg(SLAVE_A, 1, queues=4))],
        {"broker-a": ({0: MASTER_A, 1: SLAVE_A}, (8, 8))},
    ),
    (
        "unregister the slave: the master stays",
        [Reg(reg(MASTER_A, 0)), Reg(reg(SLAVE_A, 1)), Unreg(SLAVE_A, 1)],
        {"broker-a": ({0: MASTER_A}, (8, 8))},
    ),
    (
        "master gone, slave alive: queue data kept, only id 1 listed",
        [Reg(reg(MASTER_A, 0)), Reg(reg(SLAVE_A, 1)), Unreg(MASTER_A, 0)],
        {"broker-a": ({1: SLAVE_A}, (8, 8))},
    ),
    (
        "last member gone: the topic's route is gone",
        [Reg(reg(MASTER_A, 0)), Reg(reg(SLAVE_A, 1)), Unreg(MASTER_A, 0), Unreg(SLAVE_A, 1)],
        None,
    ),
    (
        "topics from a slave's registration create no queue data",
        [Reg(reg(SLAVE_A, 1, topics=("TopicTest",)))],
        None,
    ),
    (
        "expiry removes only the silent broker (scanNotActiveBroker)",
        [
            Reg(reg(MASTER_A, 0), at_ms=0),
            Reg(reg(SLAVE_A, 1), at_ms=0),
            Reg(reg(SLAVE_A, 1), at_ms=60_000),  # same address again: refreshes its time
            Expire(at_ms=TIMEOUT_MS, removed=()),  # last + timeout < now is strict
            Expire(at_ms=TIMEOUT_MS + 1, removed=(MASTER_A,)),
        ],
        {"broker-a": ({1: SLAVE_A}, (8, 8))},
    ),
    (
        "expiry of the whole group removes the topic",
        [Reg(reg(MASTER_A, 0)), Reg(reg(SLAVE_A, 1)), Expire(TIMEOUT_MS + 1, (MASTER_A, SLAVE_A))],
        None,
    ),
    (
        "two groups serve one topic; one leaves",
        [
            Reg(reg(MASTER_A, 0)),
            Reg(reg(MASTER_B, 0, name="broker-b", queues=4)),
            Unreg(MASTER_A, 0),
        ],
        {"broker-b": ({0: MASTER_B}, (4, 4))},
    ),
    (
        "old master with a lower epoch re-registering as id 0 is refused and not served",
        [
            Reg(reg(MASTER_A, 0, epoch=1)),
            Reg(reg(SLAVE_A, 0, epoch=2, queues=16)),  # promoted elsewhere, displaces the old one
            Reg(reg(MASTER_A, 0, epoch=1), stale=True),
        ],
        {"broker-a": ({0: SLAVE_A}, (16, 16))},
    ),
    (
        "slave promoted with a higher epoch replaces id 0 and leaves id 1 (switchBrokerRole)",
        [
            Reg(reg(MASTER_A, 0, epoch=1)),
            Reg(reg(SLAVE_A, 1, epoch=1)),
            Unreg(MASTER_A, 0),
            Reg(reg(SLAVE_A, 0, epoch=2, queues=16)),
            Reg(reg(MASTER_A, 1, epoch=2)),  # the old master comes back as a slave
        ],
        {"broker-a": ({0: SLAVE_A, 1: MASTER_A}, (16, 16))},
    ),
    (
        "the group remembers its epoch: an old master is fenced after its successor went silent",
        [
            Reg(reg(MASTER_A, 0, epoch=1), at_ms=0),
            Reg(reg(MASTER_B, 0, epoch=2), at_ms=0),  # the new master (on another host)
            Reg(reg(SLAVE_A, 1, epoch=2), at_ms=100_000),
            Expire(at_ms=TIMEOUT_MS + 1, removed=(MASTER_B,)),
            Reg(reg(MASTER_A, 0, epoch=1), at_ms=TIMEOUT_MS + 2, stale=True),
        ],
        {"broker-a": ({1: SLAVE_A}, (8, 8))},
    ),
    (
        "a master's new topic set replaces the old one",
        [Reg(reg(MASTER_A, 0, topics=("TopicTest",))), Reg(reg(MASTER_A, 0, topics=("Other",)))],
        None,
    ),
    (
        "equal epochs (classic mode, no controller): the newest claim of id 0 wins",
        [Reg(reg(MASTER_A, 0)), Reg(reg(MASTER_B, 0, queues=2))],
        {"broker-a": ({0: MASTER_B}, (2, 2))},
    ),
]


@pytest.mark.parametrize(("steps", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_route_after_steps(steps: list[Step], expected: Expected) -> None:
    table = RouteTable()
    run(table, steps)
    assert observed(table, "TopicTest") == expected


def test_a_slave_learns_its_master_from_registration() -> None:
    table = RouteTable()
    assert table.register(reg(SLAVE_A, 1), 0) == MasterAddresses("", "")
    assert table.register(reg(MASTER_A, 0), 0) == MasterAddresses(MASTER_A, "10.0.0.1:10912")
    assert table.register(reg(SLAVE_A, 1), 0) == MasterAddresses(MASTER_A, "10.0.0.1:10912")


def test_route_carries_ha_addresses_and_epoch() -> None:
    table = RouteTable()
    table.register(reg(MASTER_A, 0, epoch=3), 0)
    table.register(reg(SLAVE_A, 1, epoch=3), 0)
    route = table.route("TopicTest")
    assert route is not None
    (group,) = route.brokers
    assert group.ha_addresses == {0: "10.0.0.1:10912", 1: "10.0.0.2:10912"}
    assert group.epoch == 3
    assert route.queues[0].perm == 6


def test_stale_epoch_error_names_the_current_master() -> None:
    table = RouteTable()
    table.register(reg(MASTER_B, 0, epoch=5), 0)
    with pytest.raises(StaleEpochError) as info:
        table.register(reg(MASTER_A, 0, epoch=4), 0)
    assert (info.value.epoch, info.value.group_epoch, info.value.master_address) == (
        4,
        5,
        MASTER_B,
    )
    assert table.lookup(MASTER_A) is None


def test_stale_slave_claiming_master_is_dropped_from_the_group() -> None:
    """#6316: the stale claimant is not served at all, not even under its old slave id."""
    table = RouteTable()
    table.register(reg(MASTER_B, 0, epoch=5), 0)
    table.register(reg(SLAVE_A, 1, epoch=4), 0)
    with pytest.raises(StaleEpochError):
        table.register(reg(SLAVE_A, 0, epoch=4), 0)
    assert observed(table, "TopicTest") == {"broker-a": ({0: MASTER_B}, (8, 8))}


def test_unregister_of_a_displaced_address_leaves_its_successor() -> None:
    table = RouteTable()
    table.register(reg(MASTER_A, 0), 0)
    table.register(reg(MASTER_B, 0), 0)  # MASTER_B took id 0
    assert not table.unregister("DefaultCluster", "broker-a", 0, MASTER_A)
    assert not table.unregister("OtherCluster", "broker-a", 0, MASTER_B)
    assert observed(table, "TopicTest") == {"broker-a": ({0: MASTER_B}, (8, 8))}


def test_an_address_moving_to_another_group_leaves_the_first() -> None:
    table = RouteTable()
    table.register(reg(MASTER_A, 0, name="broker-a"), 0)
    table.register(reg(MASTER_A, 0, name="broker-b", topics=("Other",)), 0)
    assert table.route("TopicTest") is None
    assert table.lookup(MASTER_A) == BrokerRef("DefaultCluster", "broker-b", 0, MASTER_A)


def test_a_group_registered_under_a_second_cluster_is_refused_untouched() -> None:
    table = RouteTable()
    table.register(reg(MASTER_A, 0, cluster="c1"), 0)
    with pytest.raises(ClusterMismatchError):
        table.register(reg(SLAVE_A, 1, cluster="c2"), 0)
    assert table.broker_count() == 1


def test_cluster_info_groups_by_cluster() -> None:
    table = RouteTable()
    table.register(reg(MASTER_A, 0, cluster="c1", name="broker-a"), 10)
    table.register(reg(SLAVE_A, 1, cluster="c1", name="broker-a"), 20)
    table.register(reg(MASTER_B, 0, cluster="c2", name="broker-b", topics=("x", "y")), 30)
    info = table.cluster_info()
    assert [c.cluster for c in info] == ["c1", "c2"]
    c1, c2 = info
    assert [g.broker_name for g in c1.groups] == ["broker-a"]
    assert c1.groups[0].addresses == {0: MASTER_A, 1: SLAVE_A}
    assert [(b.registration.address, b.last_update_ms) for b in c1.brokers] == [
        (MASTER_A, 10),
        (SLAVE_A, 20),
    ]
    assert [g.broker_name for g in c2.groups] == ["broker-b"]
    assert c2.brokers[0].topics == 2


# -- random sequences ---------------------------------------------------------------------------

ADDRESSES = [f"10.0.1.{i}:10911" for i in range(1, 6)]
NAMES = ["g1", "g2", "g3"]
TOPICS = ["t1", "t2", "t3"]

registrations = st.builds(
    lambda address, name, broker_id, epoch, topics: reg(
        address, broker_id, name=name, epoch=epoch, topics=tuple(sorted(topics))
    ),
    st.sampled_from(ADDRESSES),
    st.sampled_from(NAMES),
    st.integers(0, 2),
    st.integers(0, 3),
    st.sets(st.sampled_from(TOPICS)),
)
# (operation, its registration, how far the clock moves first)
ops = st.tuples(
    st.sampled_from(["register", "unregister", "expire"]),
    registrations,
    st.integers(0, 80_000),
)


def check_invariants(table: RouteTable, now_ms: int) -> None:
    addresses: list[str] = []
    for cluster in table.cluster_info():
        for group in cluster.groups:
            assert group.addresses, f"group {group.broker_name} listed with no live broker"
            addresses += group.addresses.values()
        for live in cluster.brokers:
            assert live.last_update_ms <= now_ms
    assert len(addresses) == len(set(addresses)) == table.broker_count(), "an address twice"
    for topic in TOPICS:
        route = table.route(topic)
        assert (route is None) == (topic not in table.topics())
        if route is None:
            continue
        assert route.queues, "a route with no queue data"
        named = [q.broker_name for q in route.queues]
        assert named == [b.broker_name for b in route.brokers], "queue data names a missing group"
        for b in route.brokers:
            assert b.addresses, "a route names a group with no live broker"


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=40))
def test_random_sequences_keep_the_invariants(
    steps: list[tuple[str, BrokerRegistration, int]],
) -> None:
    table = RouteTable()
    now = 0
    for kind, r, advance_ms in steps:
        now += advance_ms
        if kind == "register":
            try:
                table.register(r, now)
            except StaleEpochError:
                assert table.lookup(r.address) is None, "a stale master is still served"
        elif kind == "unregister":
            table.unregister(r.cluster, r.broker_name, r.broker_id, r.address)
            assert table.lookup(r.address) != BrokerRef(
                r.cluster, r.broker_name, r.broker_id, r.address
            )
        else:
            removed = table.expire(now, TIMEOUT_MS)
            assert all(table.lookup(x.address) is None for x in removed)
            for cluster in table.cluster_info():
                assert all(b.last_update_ms + TIMEOUT_MS >= now for b in cluster.brokers)
        check_invariants(table, now)
