"""Config sync between master and slave, without sockets: what the master sends for the
versions a slave holds, and how the slave applies it (offsets newer-wins, RocketMQ #1094)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidemq.protos import broker_pb2
from tidemq.services.broker import config_sync
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.broker.convert import topic_proto
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.offsets import CommittedOffset, OffsetManager
from tidemq.services.broker.topics import TopicConfig, TopicManager


class Broker:
    """The three tables of one broker, on disk under ``root``."""

    def __init__(self, root: Path) -> None:
        self.topics = TopicManager(str(root))
        self.groups = SubscriptionGroupManager(str(root))
        self.offsets = OffsetManager(str(root))

    def answer(self, slave: Broker, *, full: bool = False) -> Any:
        request = broker_pb2.SyncConfigRequest(
            topics_version=config_sync.version_proto(slave.topics.data_version),
            groups_version=config_sync.version_proto(slave.groups.data_version),
            full=full,
        )
        return config_sync.answer(request, self.topics, self.groups, self.offsets, topic_proto)


def syncer(b: Broker, changed: list[int]) -> ConfigSync:
    return ConfigSync(b.topics, b.groups, b.offsets, 3000, 60000, lambda: changed.append(1))


def test_slave_gets_topics_groups_and_offsets_then_only_what_changed(tmp_path: Path) -> None:
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.topics.upsert(TopicConfig("orders", 4, 4))
    master.groups.observe("billing", broker_pb2.CLUSTERING, ["orders"], now_ms=10)
    master.offsets.commit("billing", "orders", 0, 42, now_ms=100)
    changed: list[int] = []
    sync = syncer(slave, changed)

    first = master.answer(slave)
    assert first.topics_included and first.groups_included
    assert sync.apply(first) is True
    assert [t.topic for t in slave.topics.all()] == ["orders"]
    assert slave.topics.data_version == master.topics.data_version
    assert [(g.group, g.topics) for g in slave.groups.all()] == [("billing", ("orders",))]
    assert slave.offsets.query("billing", "orders", 0) == 42

    again = master.answer(slave)
    assert not again.topics_included and not again.groups_included  # versions match
    assert len(again.offsets) == 1  # offsets always come whole
    assert sync.apply(again) is False
    assert master.answer(slave, full=True).topics_included  # a full sync sends everything

    master.topics.delete("orders")
    assert sync.apply(master.answer(slave)) is True
    assert slave.topics.all() == []


def test_a_newer_offset_committed_on_the_slave_survives_the_masters_older_one(
    tmp_path: Path,
) -> None:
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.offsets.commit("g", "orders", 0, 100, now_ms=1_000)
    master.offsets.commit("g", "orders", 1, 100, now_ms=1_000)
    sync = syncer(slave, [])
    sync.apply(master.answer(slave))
    # The master is away; the consumer reads from the slave and commits there.
    slave.offsets.commit("g", "orders", 0, 250, now_ms=5_000)
    # The master returns with its old table: queue 0 keeps the slave's newer commit.
    sync.apply(master.answer(slave))
    assert slave.offsets.query("g", "orders", 0) == 250
    assert slave.offsets.query("g", "orders", 1) == 100
    # A commit on the master after that one is newer still, and wins.
    master.offsets.commit("g", "orders", 0, 300, now_ms=9_000)
    sync.apply(master.answer(slave))
    assert slave.offsets.query("g", "orders", 0) == 300


def test_merge_counts_and_survives_a_restart(tmp_path: Path) -> None:
    om = OffsetManager(str(tmp_path))
    om.commit("g", "t", 0, 5, now_ms=50)
    result = om.merge([CommittedOffset("g", "t", 0, 3, 40), CommittedOffset("g", "t", 1, 9, 60)])
    assert (result.taken, result.kept) == (1, 1)
    assert om.persist()
    again = OffsetManager(str(tmp_path))
    assert sorted(again.entries(), key=lambda o: o.queue_id) == [
        CommittedOffset("g", "t", 0, 5, 50),
        CommittedOffset("g", "t", 1, 9, 60),
    ]


def test_subscription_groups_only_grow_and_do_not_flap(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    assert groups.observe("g", 1, ["a"], now_ms=1)
    assert groups.observe("g", 1, ["b"], now_ms=2)  # another member, another topic
    version = groups.data_version.counter
    assert not groups.observe("g", 1, ["a"], now_ms=3)  # nothing new: no write
    assert groups.data_version.counter == version
    (g,) = SubscriptionGroupManager(str(tmp_path)).all()
    assert (g.group, g.mode, g.topics, g.created_ms) == ("g", 1, ("a", "b"), 1)
