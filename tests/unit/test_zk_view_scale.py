"""The ZooKeeper registry at scale without ZooKeeper: format 2 pinned by golden bytes, the
nameserver's incremental view (``zk_view``) at 100,000 topics with churn, fed in different
interleavings, and the broker's shard book (``zk_topic_shards``) writing only changed shards."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.services.broker.topics import DataVersion as TopicsVersion
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.broker.zk_topic_shards import ShardBook
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    BrokerRole,
    DataVersion,
    TopicQueues,
)
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.services.nameserver.zk_routes import BrokerZnode, build_route_table, routes_view
from tidemq.services.nameserver.zk_view import RegistryView, ShardZnode

pytestmark = pytest.mark.unit

CLUSTER = "DefaultCluster"


def registration(name: str, broker_id: int, address: str) -> BrokerRegistration:
    return BrokerRegistration(
        cluster=CLUSTER,
        broker_name=name,
        broker_id=broker_id,
        address=address,
        ha_address=address if broker_id == 0 else "",
        role=BrokerRole.SYNC_MASTER if broker_id == 0 else BrokerRole.SLAVE,
        epoch=0,
        data_version=DataVersion(0, 7, 1_700_000_000_000),
    )


# -- format 2, pinned -----------------------------------------------------------------------

LEAF_GOLDEN = (
    b'{"address":"10.0.0.1:10911","broker_id":0,"broker_name":"broker-a",'
    b'"cluster":"DefaultCluster","data_version":{"counter":7,"state_version":0,'
    b'"timestamp_ms":1700000000000},"epoch":0,"format":2,"ha_address":"10.0.0.1:10911",'
    b'"role":"SYNC_MASTER"}'
)
SHARD_GOLDEN = (
    b'{"format":2,"topics":[{"perm":6,"read_queue_nums":8,"topic":"orders","write_queue_nums":4}]}'
)


def test_format_2_leaf_and_shard_bytes_are_pinned() -> None:
    reg = registration("broker-a", 0, "10.0.0.1:10911")
    assert zk_format.encode_leaf(reg) == LEAF_GOLDEN
    node = zk_format.BrokerNodeName(CLUSTER, "broker-a", 0)
    leaf = zk_format.decode_leaf(node, LEAF_GOLDEN)
    assert (leaf.registration, leaf.inline) == (reg, False)
    # The hash is the layout: every broker and nameserver version must agree on it.
    assert [zk_format.shard_of(t) for t in ("orders", "payments", "TBW102", "a")] == [
        "ee",
        "32",
        "a4",
        "43",
    ]
    orders = TopicQueues("orders", 8, 4, 6)
    assert zk_format.encode_shard("ee", [orders]) == SHARD_GOLDEN
    assert zk_format.decode_shard("ee", SHARD_GOLDEN) == {"orders": orders}
    assert (
        zk_format.shard_dir("/mq", CLUSTER, "broker-a", 1) == "/mq/topics/DefaultCluster/broker-a/1"
    )


@pytest.mark.parametrize(
    ("shard", "data", "complaint"),
    [
        ("a4", SHARD_GOLDEN, "belongs in shard ee"),
        ("8", SHARD_GOLDEN, "is not a shard"),
        ("ee", b'{"format":3,"topics":[]}', "shard format 3"),
        ("ee", b'{"format":2}', "topics must be a list"),
        ("ee", SHARD_GOLDEN.replace(b'"perm":6', b'"perm":99'), "perm 99"),
        ("ee", SHARD_GOLDEN.replace(b"orders", b"bad topic"), "topic"),
    ],
)
def test_bad_shards_are_refused_with_a_reason(shard: str, data: bytes, complaint: str) -> None:
    with pytest.raises(zk_format.ZnodeDataError, match=complaint):
        zk_format.decode_shard(shard, data)


def test_a_shard_over_the_znode_limit_is_refused_at_encoding() -> None:
    topics = [TopicQueues(f"t{i}-" + "x" * 120, 8, 8, 6) for i in range(8_000)]
    with pytest.raises(zk_format.ZnodeDataError, match=r"shard 00 .* znode limit"):
        zk_format.encode_shard("00", topics)


# -- the view at scale -----------------------------------------------------------------------

BROKERS = [  # (group, id, address, session)
    ("broker-a", 0, "10.0.0.1:10911", 0xA0),
    ("broker-a", 1, "10.0.0.2:10911", 0xA1),
    ("broker-b", 0, "10.0.0.3:10911", 0xB0),
    ("broker-c", 0, "10.0.0.4:10911", 0xC0),
    ("broker-c", 1, "10.0.0.5:10911", 0xC1),
]


def leaf_znode(
    index: int, czxid: int, *, fmt1_topics: list[TopicQueues] | None = None
) -> BrokerZnode:
    name, broker_id, address, session = BROKERS[index]
    reg = registration(name, broker_id, address)
    data = (
        zk_format.encode_leaf(reg)
        if fmt1_topics is None
        else zk_format.encode_registration(
            BrokerRegistration(**{**reg.__dict__, "topics": tuple(fmt1_topics)})
        )
    )
    return BrokerZnode(CLUSTER, name, str(broker_id), data, czxid, 1_000 + czxid, session)


class Broker:
    """One broker's topics by shard, and the shard znodes it would write."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.shards: dict[str, dict[str, TopicQueues]] = {}

    def put(self, t: TopicQueues) -> str:
        shard = zk_format.shard_of(t.topic)
        self.shards.setdefault(shard, {})[t.topic] = t
        return shard

    def drop(self, topic: str) -> str:
        shard = zk_format.shard_of(topic)
        self.shards[shard].pop(topic)
        return shard

    def event(self, shard: str) -> tuple[str, ShardZnode | tuple[tuple[str, str, str], str]]:
        name, broker_id, _, session = BROKERS[self.index]
        topics = self.shards.get(shard)
        if not topics:
            return ("removed", ((CLUSTER, name, str(broker_id)), shard))
        data = zk_format.encode_shard(shard, topics.values())
        return ("set", ShardZnode(CLUSTER, name, str(broker_id), shard, data, session))

    def all_events(self) -> Iterator[tuple[str, ShardZnode | tuple[tuple[str, str, str], str]]]:
        for shard in sorted(self.shards):
            yield self.event(shard)

    def topics(self) -> list[TopicQueues]:
        return [t for shard in self.shards.values() for t in shard.values()]


def feed(view: RegistryView, events: list[tuple[str, object]]) -> None:
    for kind, what in events:
        if kind == "set":
            assert isinstance(what, ShardZnode)
            view.set_shard(what)
        elif kind == "removed":
            view.remove_shard(*what)  # type: ignore[misc]
        elif kind == "leaf":
            assert isinstance(what, BrokerZnode)
            view.set_leaf(what)
        else:
            view.remove_leaf(what)  # type: ignore[arg-type]


def rebuilt(leaves: list[BrokerZnode], brokers: list[Broker]) -> RouteTable:
    by_path = {
        f"{CLUSTER}/{BROKERS[b.index][0]}/{BROKERS[b.index][1]}": b.topics() for b in brokers
    }
    table, problems = build_route_table(leaves, by_path)
    assert problems == {}
    return table


def test_100k_topics_converge_in_any_interleaving_and_a_shard_costs_only_its_topics() -> None:
    rng = random.Random(27)
    brokers = [Broker(i) for i in range(len(BROKERS))]
    # Each group's slaves copy their master's topics (config sync); 100,000 topics in all.
    for n in range(100_000):
        group = ("broker-a", "broker-b", "broker-c")[n % 3]
        t = TopicQueues(f"topic-{n:06d}", 8, 8, 6)
        for b in brokers:
            if BROKERS[b.index][0] == group:
                b.put(t)
    leaves = [leaf_znode(i, czxid=10 + i) for i in range(len(BROKERS))]
    initial: list[tuple[str, object]] = [("leaf", z) for z in leaves]
    for b in brokers:
        initial.extend(b.all_events())

    first, second = RegistryView(), RegistryView()
    feed(first, initial)
    shuffled = initial[:]
    rng.shuffle(shuffled)  # a full read finds the znodes in any order
    feed(second, shuffled)
    assert first.settle() and second.settle()
    assert first.table is not None and second.table is not None
    assert first.table.topic_count() == 100_000

    # Churn: topics created and deleted on masters and slaves, one shard event each.
    churn: list[tuple[str, object]] = []
    for n in range(2_000):
        b = brokers[rng.randrange(len(brokers))]
        if n % 3 == 2:
            victim = rng.choice(list(rng.choice(list(b.shards.values()))))
            churn.append(b.event(b.drop(victim)))
        else:
            churn.append(b.event(b.put(TopicQueues(f"new-{n:05d}", 4, 4, 6))))
    # A second nameserver may see events of different znodes in another order, never the
    # events of one znode out of order, and only their latest matters: keep each znode's last.
    latest: dict[str, tuple[str, object]] = {}
    for kind, what in churn:
        key = what.path if isinstance(what, ShardZnode) else "/".join((*what[0], what[1]))  # type: ignore[index]
        latest[key] = (kind, what)
    reordered = list(latest.values())
    rng.shuffle(reordered)

    before = first.topics_touched
    for event in churn:
        touched = first.topics_touched
        feed(first, [event])
        # One shard event costs that shard's topics (old and new), never all topics.
        assert first.topics_touched - touched <= 2 * (100_000 // 256) + 200
    assert first.rebuilds == 1, "shard events never rebuild"
    per_event = (first.topics_touched - before) / len(churn)
    assert per_event < 1_000, per_event  # ~2 x 130 topics a shard for a master, 0 for a slave
    feed(second, reordered)
    assert not first.settle() and not second.settle()

    expected = rebuilt(leaves, brokers)
    assert routes_view(first.table) == routes_view(expected)
    assert routes_view(second.table) == routes_view(expected)

    # A master leaves (a leaf event): one rebuild; its group serves reads from its slave's copy.
    feed(first, [("leaf-removed", (CLUSTER, "broker-a", "0"))])
    assert first.settle() and first.rebuilds == 2
    route = first.table.route(brokers[1].topics()[0].topic)
    assert route is not None and route.brokers[0].addresses == {1: "10.0.0.2:10911"}
    # Now the slave is broker-a's topic source: its shard events move the table in place.
    shard, topics = next(iter(brokers[1].shards.items()))
    brokers[1].drop(next(iter(topics)))
    feed(first, [brokers[1].event(shard)])
    assert routes_view(first.table) == routes_view(rebuilt(leaves[1:], brokers[1:]))


def test_a_format_1_leaf_is_still_read_beside_format_2_and_foreign_shards_are_not_served() -> None:
    view = RegistryView()
    old = leaf_znode(2, czxid=1, fmt1_topics=[TopicQueues("legacy", 2, 2, 6)])
    new = leaf_znode(0, czxid=2)
    view.set_leaf(old)
    view.set_leaf(new)
    orders = TopicQueues("orders", 8, 8, 6)
    data = zk_format.encode_shard("ee", [orders])
    # A shard left by the broker's previous session (another owner) is held, not served.
    view.set_shard(ShardZnode(CLUSTER, "broker-a", "0", "ee", data, 0xDEAD))
    view.settle()
    assert view.table is not None
    assert view.table.topics() == ["legacy"]
    view.set_shard(ShardZnode(CLUSTER, "broker-a", "0", "ee", data, BROKERS[0][3]))
    assert view.table.topics() == ["legacy", "orders"]
    # Shards of a format-1 broker are ignored: its leaf holds its topics.
    view.set_shard(ShardZnode(CLUSTER, "broker-b", "0", "ee", data, BROKERS[2][3]))
    route = view.table.route("orders")
    assert route is not None and [q.broker_name for q in route.queues] == ["broker-a"]
    # An invalid shard is skipped with its reason, never fatal.
    view.set_shard(ShardZnode(CLUSTER, "broker-a", "0", "a4", data, BROKERS[0][3]))
    assert "belongs in shard ee" in view.problems[f"{CLUSTER}/broker-a/0/a4"]
    view.remove_shard((CLUSTER, "broker-a", "0"), "ee")
    assert view.table.topics() == ["legacy"]


# -- the broker's shard book -----------------------------------------------------------------


def seeded(store: Path, count: int) -> TopicManager:
    (store / "config").mkdir(parents=True)
    doc = {
        "topics": [
            {"topic": f"topic-{n:06d}", "read_queue_nums": 8, "write_queue_nums": 8}
            for n in range(count)
        ]
        + [{"topic": "%SYS%log", "read_queue_nums": 1, "write_queue_nums": 1}],
        "data_version": {"state_version": 0, "counter": count, "timestamp_ms": 0},
    }
    (store / "config" / "topics.json").write_text(json.dumps(doc))
    return TopicManager(str(store))


def test_the_shard_book_marks_only_the_changed_shards(tmp_path: Path) -> None:
    topics = seeded(tmp_path, 20_000)
    book = ShardBook()
    book.update(topics)
    assert book.full_reads == 1
    assert len(book.dirty) == 256  # everything, once
    assert sum(len(s) for s in book.content.values()) == 20_000  # %SYS% is not published
    book.dirty.clear()

    topics.upsert(TopicConfig("orders", 4, 4))
    book.update(topics)
    assert (book.dirty, book.full_reads) == ({zk_format.shard_of("orders")}, 1)
    data = book.encoded(zk_format.shard_of("orders"))
    assert data is not None and len(data) < 20_000 / 256 * 120
    book.dirty.clear()

    topics.delete("orders")
    book.update(topics)
    shard = zk_format.shard_of("orders")
    assert book.dirty == {shard} and "orders" not in book.content.get(shard, {})
    book.dirty.clear()
    # When the table cannot say what changed (a slave's config sync replaced it), the book
    # compares every shard and still marks only those that differ.
    table = [t for t in topics.all() if t.topic != "topic-000001"]
    topics.replace_all(table, TopicsVersion(1, 5, 0))
    book.update(topics)
    assert (book.dirty, book.full_reads) == ({zk_format.shard_of("topic-000001")}, 2)
