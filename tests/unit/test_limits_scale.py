"""max_topics and max_groups: creating past them is refused with a typed, non-retriable
RESOURCE_EXHAUSTED / LIMIT_EXCEEDED naming the setting, and nothing changes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker import limits
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.topics import TopicChanges, TopicConfig, TopicManager
from tidemq.services.errors import to_service_error


def test_topics_past_max_topics_are_refused_and_nothing_changes(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path), max_topics=2)
    topics.upsert(TopicConfig("a", 1, 1))
    topics.upsert(TopicConfig("b", 1, 1))
    version = (topics.data_version.counter, topics.data_version.timestamp_ms)
    journal = Path(topics.journal_path).read_bytes()
    with pytest.raises(limits.LimitExceededError) as e:
        topics.upsert(TopicConfig("c", 1, 1))  # what auto-create on first send calls too
    err = to_service_error(e.value)
    assert err.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.code == common_pb2.LIMIT_EXCEEDED and not err.retriable
    assert "max_topics = 2" in str(err) and "--max-topics" in str(err)
    assert [t.topic for t in topics.all()] == ["a", "b"]
    assert (topics.data_version.counter, topics.data_version.timestamp_ms) == version
    assert Path(topics.journal_path).read_bytes() == journal
    assert topics.upsert(TopicConfig("a", 2, 2)) is False  # updates still work at the limit
    topics.delete("b")
    assert topics.upsert(TopicConfig("c", 1, 1)) is True


def test_a_slave_takes_its_masters_topics_whatever_its_limit(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path), max_topics=1)
    since = TopicManager(str(tmp_path / "x")).data_version
    master = TopicManager(str(tmp_path / "m"))
    master.upsert(TopicConfig("a", 1, 1))
    master.upsert(TopicConfig("b", 1, 1))
    changes = master.changes_since(since)
    assert isinstance(changes, TopicChanges)
    assert topics.apply_changes(changes, since) is True
    assert len(topics.all()) == 2


def test_groups_past_max_groups_are_refused_and_nothing_changes(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path), max_groups=1)
    groups.observe("g1", broker_pb2.CLUSTERING, ["orders"], now_ms=1)
    version = (groups.data_version.counter, groups.data_version.timestamp_ms)
    for create in (
        lambda: groups.observe("g2", broker_pb2.CLUSTERING, ["orders"], now_ms=2),
        lambda: groups.use_model("g2", broker_pb2.RECEIVE, 2, topics=["orders"]),
        lambda: groups.update("g2", fifo=True, now_ms=2),
    ):
        with pytest.raises(limits.LimitExceededError, match="max_groups = 1"):
            create()
    assert [g.group for g in groups.all()] == ["g1"]
    assert (groups.data_version.counter, groups.data_version.timestamp_ms) == version
    groups.observe("g1", broker_pb2.CLUSTERING, ["audit"], now_ms=3)  # a known group still changes


def test_the_settings_default_to_the_limits_and_are_validated() -> None:
    cfg = BrokerConfig(store_dir="/x")
    assert cfg.max_topics == limits.DEFAULT_MAX_TOPICS
    assert cfg.max_groups == limits.DEFAULT_MAX_GROUPS
