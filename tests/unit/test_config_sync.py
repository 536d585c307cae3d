"""Config sync between master and slave, without sockets: what the master sends for the
versions a slave holds, and how both sides merge offsets (by version, RocketMQ #1094)."""

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
        """This broker's answer to ``slave``'s sync request (which carries its offsets)."""
        request = syncer(slave, []).request(full)
        return config_sync.answer(request, self.topics, self.groups, self.offsets, topic_proto)


def syncer(b: Broker, changed: list[int]) -> ConfigSync:
    return ConfigSync(b.topics, b.groups, b.offsets, 3000, 60000, lambda: changed.append(1))


def test_slave_gets_topics_groups_and_offsets_then_only_what_changed(tmp_path: Path) -> None:
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.topics.upsert(TopicConfig("orders", 4, 4))
    master.groups.observe("billing", broker_pb2.CLUSTERING, ["orders"], now_ms=10)
    master.offsets.commit("billing", "orders", 0, 42)
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


def test_offsets_committed_on_the_slave_while_the_master_was_away_reach_the_master(
    tmp_path: Path,
) -> None:
    """Static master/slave, RocketMQ #1094: the master dies, consumers commit on the slave, the
    master returns with its old table. The slave's next sync hands the newer offsets back, and
    neither side moves an offset backwards."""
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.offsets.commit("g", "orders", 0, 100)
    master.offsets.commit("g", "orders", 1, 100)
    sync = syncer(slave, [])
    sync.apply(master.answer(slave))
    # The master is away; the consumer reads from the slave and commits there.
    slave.offsets.commit("g", "orders", 0, 250)
    # The master returns with its old table; the slave's sync carries its own.
    sync.apply(master.answer(slave))
    for b in (master, slave):
        assert b.offsets.query("g", "orders", 0) == 250
        assert b.offsets.query("g", "orders", 1) == 100
    # The consumer moves back to the master and commits further there: that wins everywhere.
    master.offsets.commit("g", "orders", 0, 300)
    sync.apply(master.answer(slave))
    assert slave.offsets.query("g", "orders", 0) == 300


def test_an_old_master_returning_as_a_slave_takes_the_newer_offsets_and_keeps_none_older(
    tmp_path: Path,
) -> None:
    """Automatic failover: the old master's table is older than the new master's; syncing from
    the new master, it sends its offsets along but the new master keeps its own, and the old
    master ends with the new master's."""
    old, new = Broker(tmp_path / "old"), Broker(tmp_path / "new")
    old.offsets.commit("g", "orders", 0, 100)
    syncer(new, []).apply(old.answer(new))  # the new master was once the old one's slave
    new.offsets.commit("g", "orders", 0, 180)  # consumers commit on the new master
    new.offsets.commit("g", "orders", 1, 5)
    syncer(old, []).apply(new.answer(old))  # the old master returns as the new one's slave
    for b in (old, new):
        assert b.offsets.query("g", "orders", 0) == 180
        assert b.offsets.query("g", "orders", 1) == 5


def test_a_reset_on_the_master_replaces_a_higher_offset_on_the_slave_in_both_directions(
    tmp_path: Path,
) -> None:
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.offsets.commit("g", "orders", 0, 500)
    sync = syncer(slave, [])
    sync.apply(master.answer(slave))
    slave.offsets.commit("g", "orders", 0, 600)  # a consumer on the slave, before the reset
    master.offsets.commit("g", "orders", 0, 0, reset=True)  # the operator rewinds the group
    sync.apply(master.answer(slave))
    assert master.offsets.query("g", "orders", 0) == 0  # the slave's 600 did not undo it
    assert slave.offsets.query("g", "orders", 0) == 0
    # After the reset, commits move forward from it as usual (in its generation).
    assert slave.offsets.commit("g", "orders", 0, 600) == 600
    sync.apply(master.answer(slave))
    assert master.offsets.query("g", "orders", 0) == 600
    # A second reset starts generation 2 and again wins over everything older.
    master.offsets.commit("g", "orders", 0, 7, reset=True)
    sync.apply(master.answer(slave))
    assert (master.offsets.query("g", "orders", 0), slave.offsets.query("g", "orders", 0)) == (
        7,
        7,
    )


def test_merge_counts_and_survives_a_restart(tmp_path: Path) -> None:
    om = OffsetManager(str(tmp_path))
    om.commit("g", "t", 0, 5)
    om.commit("g", "t", 2, 9, reset=True)
    result = om.merge([CommittedOffset("g", "t", 0, 3), CommittedOffset("g", "t", 1, 9)])
    assert (result.taken, result.kept) == (1, 1)
    assert om.persist()
    again = OffsetManager(str(tmp_path))
    assert sorted(again.entries(), key=lambda o: o.queue_id) == [
        CommittedOffset("g", "t", 0, 5),
        CommittedOffset("g", "t", 1, 9),
        CommittedOffset("g", "t", 2, 9, generation=1),
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
