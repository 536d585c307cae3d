"""Incremental config sync without sockets: the master answers what changed since the versions
(and offset cursor) a slave holds, the slave applies it and ends equal to the master, and the
whole-table answer still comes when the change log does not reach back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.protos import broker_pb2
from tidemq.services.broker import change_log, config_sync
from tidemq.services.broker import topics as topics_mod
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.broker.convert import topic_proto
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.topics import DataVersion, TopicConfig, TopicManager


class Broker:
    def __init__(self, root: Path) -> None:
        self.topics = TopicManager(str(root))
        self.groups = SubscriptionGroupManager(str(root))
        self.offsets = OffsetManager(str(root))


class Pair:
    """A master and a slave with one ConfigSync, syncing as the slave's loop does."""

    def __init__(self, tmp_path: Path) -> None:
        self.master, self.slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
        self.sync = ConfigSync(
            self.slave.topics, self.slave.groups, self.slave.offsets, 3000, 60000, lambda: None
        )
        self.requests: list[object] = []

    def once(self, *, full: bool = False) -> broker_pb2.SyncConfigResponse:
        request = self.sync.request(full)
        self.requests.append(request)
        m = self.master
        response = config_sync.answer(request, m.topics, m.groups, m.offsets, topic_proto)
        self.sync.apply(response)
        self.sync._sent_seq = self.sync._asked_seq  # what sync_once does after success
        return response

    def assert_equal(self) -> None:
        m, s = self.master, self.slave
        assert s.topics.all() == m.topics.all()
        assert s.topics.data_version == m.topics.data_version
        assert s.groups.all() == m.groups.all()
        assert s.groups.data_version == m.groups.data_version
        assert set(s.offsets.entries()) == set(m.offsets.entries())


def test_after_the_first_sync_only_changes_travel(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    for i in range(200):
        p.master.topics.upsert(TopicConfig(f"t{i:03d}", 4, 4))
    for g in range(50):
        p.master.groups.observe(f"g{g}", broker_pb2.CLUSTERING, ["t000"], now_ms=1)
        for q in range(4):
            p.master.offsets.commit(f"g{g}", "t000", q, 10)
    first = p.once(full=True)
    assert len(first.topics) == 200 and not first.topics_incremental
    assert len(first.offsets) == 200
    p.assert_equal()

    p.master.topics.upsert(TopicConfig("t001", 8, 8))
    p.master.topics.delete("t002")
    p.master.topics.upsert(TopicConfig("new", 1, 1))
    p.master.groups.update("g3", fifo=True, now_ms=2)
    p.master.groups.delete("g4")
    p.master.offsets.commit("g1", "t000", 2, 99)
    delta = p.once()
    assert delta.topics_incremental and delta.groups_incremental and delta.offsets_incremental
    assert sorted(t.topic for t in delta.topics) == ["new", "t001"]
    assert list(delta.removed_topics) == ["t002"]
    assert [g.group for g in delta.groups] == ["g3"] and list(delta.removed_groups) == ["g4"]
    assert [(o.group, o.queue_id, o.offset) for o in delta.offsets] == [("g1", 2, 99)]
    p.assert_equal()

    idle = p.once()
    assert not idle.topics_included and not idle.groups_included and len(idle.offsets) == 0
    assert len(p.requests[-1].offsets) == 0  # type: ignore[attr-defined]

    # A commit on the slave travels back alone, and the slave's own changes_since still works.
    p.slave.offsets.commit("g2", "t000", 0, 50)
    since = DataVersion(**vars(p.slave.topics.data_version))
    p.master.topics.upsert(TopicConfig("later", 2, 2))
    p.once()
    assert len(p.requests[-1].offsets) == 1  # type: ignore[attr-defined]
    assert p.master.offsets.query("g2", "t000", 0) == 50
    p.assert_equal()
    changes = p.slave.topics.changes_since(since)
    assert changes is not None and [t.topic for t in changes.upserted] == ["later"]
    # And after a restart the slave's journal holds what the deltas brought.
    assert TopicManager(str(tmp_path / "s")).all() == p.master.topics.all()
    assert SubscriptionGroupManager(str(tmp_path / "s")).all() == p.master.groups.all()


def test_a_slave_behind_the_change_log_gets_the_whole_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topics_mod, "CHANGE_LOG_ENTRIES", 5)
    p = Pair(tmp_path)
    p.once()
    for i in range(20):
        p.master.topics.upsert(TopicConfig(f"t{i:02d}", 1, 1))
    behind = p.once()
    assert behind.topics_included and not behind.topics_incremental  # replace_all path
    assert len(behind.topics) == 20
    p.assert_equal()
    p.master.topics.delete("t05")
    assert p.once().topics_incremental
    p.assert_equal()


def test_a_restarted_master_sends_every_offset_again(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    p.master.offsets.commit("g", "orders", 0, 5)
    p.once()
    p.master.offsets.persist()
    p.master = Broker(tmp_path / "m")  # another process: another cursor instance
    answer = p.once()
    assert not answer.offsets_incremental and len(answer.offsets) == 1
    p.assert_equal()


def test_a_delta_for_a_table_that_moved_is_not_applied(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    p.once()
    p.master.topics.upsert(TopicConfig("orders", 4, 4))
    request = p.sync.request(False)
    m = p.master
    response = config_sync.answer(request, m.topics, m.groups, m.offsets, topic_proto)
    p.slave.topics.upsert(TopicConfig("restored", 1, 1))  # e.g. a failover's restore
    assert p.sync.apply(response) is False
    assert p.slave.topics.get("orders") is None
    p.once()  # the next sync asks from where the slave is: the whole table
    p.assert_equal()


def test_an_old_slave_still_gets_whole_tables(tmp_path: Path) -> None:
    master = Broker(tmp_path / "m")
    master.topics.upsert(TopicConfig("orders", 4, 4))
    master.offsets.commit("g", "orders", 0, 5)
    old = broker_pb2.SyncConfigRequest(topics_version=config_sync.version_proto(DataVersion()))
    response = config_sync.answer(old, master.topics, master.groups, master.offsets, topic_proto)
    assert response.topics_included and not response.topics_incremental
    assert len(response.topics) == 1 and len(response.offsets) == 1
    assert not response.HasField("offsets_cursor")


def test_change_log_since_versions() -> None:
    log = change_log.ChangeLog(floor=DataVersion(0, 3, 30), capacity=2)
    for counter, key in ((4, "a"), (5, "b"), (6, "a")):
        log.record(counter, key, counter * 10)
    now = DataVersion(0, 6, 0)
    assert log.since(DataVersion(0, 5, 0), now) == {"a"}
    assert log.since(DataVersion(0, 4, 0), now) == {"a", "b"}
    assert log.since(DataVersion(0, 3, 0), now) is None  # fell out of the log
    assert log.since(DataVersion(1, 5, 0), now) is None  # another state version
    assert log.since(DataVersion(0, 7, 0), now) is None  # ahead
    assert log.had(DataVersion(0, 5, 50)) and not log.had(DataVersion(0, 5, 51))
    assert not log.had(DataVersion(0, 3, 30))  # below the floor now
