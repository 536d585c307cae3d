"""Consumer groups on disk, without sockets: the consume model fixed by the first use and
refused to the other model, settings with their defaults and limits, files written before
either existed, and the settings reaching a slave by config sync."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker import config_sync
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.broker.convert import topic_proto
from tidemq.services.broker.groups import (
    FILE_NAME,
    GroupSettings,
    SubscriptionGroupManager,
    group_of,
    group_proto,
)
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.receive.retry_policy import DEFAULT_DELAYS_MS, RetryPolicy
from tidemq.services.broker.topics import TopicManager
from tidemq.services.errors import ServiceError
from tidemq.storage.state_file import StateFileError

OFFSETS, RECEIVE, UNSPECIFIED = broker_pb2.OFFSETS, broker_pb2.RECEIVE, 0
CLUSTERING = broker_pb2.CLUSTERING


def reopen(m: SubscriptionGroupManager) -> SubscriptionGroupManager:
    return SubscriptionGroupManager(m.store_dir)


def assert_mismatch(err: pytest.ExceptionInfo[ServiceError], group: str, wants: str) -> None:
    e = err.value
    assert (e.status, e.code, e.retriable) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        common_pb2.CONSUME_MODEL_MISMATCH,
        False,
    )
    assert f"consumer group {group!r}" in str(e)
    assert f"`tidemq consumer-group update {group} --model {wants}`" in str(e)


def test_a_new_group_gets_the_default_settings(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    g = groups.use_model("orders-worker", RECEIVE, now_ms=5, topics=["orders"])
    assert (g.model, g.topics, g.created_ms) == (RECEIVE, ("orders",), 5)
    s = g.settings
    assert (s.max_delivery_attempts, s.fifo, s.consume_enabled) == (16, False, True)
    assert s.retry_policy.delays_ms == DEFAULT_DELAYS_MS
    assert s.retry_policy.delays_ms[:4] == (1_000, 5_000, 10_000, 30_000)
    assert s.retry_policy.delays_ms[-1] == 7_200_000
    assert reopen(groups).get("orders-worker") == g  # persisted before it is answered


def test_the_first_use_fixes_the_model_and_the_other_model_is_refused(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.use_model("r", RECEIVE, now_ms=1)
    assert groups.observe("o", CLUSTERING, ["orders"], now_ms=1, model=OFFSETS)

    with pytest.raises(ServiceError) as err:
        groups.observe("r", CLUSTERING, ["orders"], now_ms=2, model=OFFSETS)
    assert_mismatch(err, "r", "offsets")
    assert "receive/ack (model RECEIVE" in str(err.value)
    with pytest.raises(ServiceError) as err:
        groups.check_model("r", OFFSETS)  # a pull or a commit
    assert_mismatch(err, "r", "offsets")
    with pytest.raises(ServiceError) as err:
        groups.use_model("o", RECEIVE, now_ms=2)  # a receive
    assert_mismatch(err, "o", "receive")
    assert "offsets (model OFFSETS" in str(err.value)

    # Refusals change nothing, on disk either.
    after = reopen(groups)
    assert after.get("r").model == RECEIVE  # type: ignore[union-attr]
    assert after.get("o").model == OFFSETS  # type: ignore[union-attr]
    assert after.get("r").topics == ()  # type: ignore[union-attr]


def test_a_heartbeat_without_a_model_counts_as_offsets(tmp_path: Path) -> None:
    """Clients older than receive/ack send CONSUME_MODEL_UNSPECIFIED."""
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.observe("old-client", CLUSTERING, ["orders"], now_ms=1, model=UNSPECIFIED)
    assert groups.get("old-client").model == OFFSETS  # type: ignore[union-attr]
    groups.use_model("r", RECEIVE, now_ms=1)
    with pytest.raises(ServiceError) as err:
        groups.observe("r", CLUSTERING, ["orders"], now_ms=2, model=UNSPECIFIED)
    assert_mismatch(err, "r", "offsets")


def test_checks_change_nothing_and_repeated_use_writes_nothing(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.check_model("unknown", RECEIVE)
    groups.check_model("unknown", OFFSETS)
    assert groups.get("unknown") is None
    groups.use_model("r", RECEIVE, now_ms=1, topics=["a"])
    version = groups.data_version.counter
    groups.use_model("r", RECEIVE, now_ms=2, topics=["a"])
    groups.use_model("r", RECEIVE, now_ms=3)
    assert groups.data_version.counter == version
    groups.use_model("r", RECEIVE, now_ms=4, topics=["b"])  # a new topic is a change
    assert groups.get("r").topics == ("a", "b")  # type: ignore[union-attr]
    assert groups.data_version.counter == version + 1


def test_a_group_known_before_models_takes_the_model_of_its_first_use(tmp_path: Path) -> None:
    """subscriptionGroup.json written before receive/ack: no model, no settings."""
    config = tmp_path / "config"
    config.mkdir()
    old = {
        "groups": [
            {"group": "legacy", "mode": 1, "topics": ["orders"], "created_ms": 10},
            {"group": "migrating", "mode": 1, "topics": ["orders"], "created_ms": 11},
        ],
        "data_version": {"state_version": 0, "counter": 7, "timestamp_ms": 99},
    }
    (config / FILE_NAME).write_text(json.dumps(old))
    groups = SubscriptionGroupManager(str(tmp_path))
    legacy = groups.get("legacy")
    assert legacy is not None
    assert (legacy.model, legacy.settings, legacy.topics) == (
        UNSPECIFIED,
        GroupSettings(),
        ("orders",),
    )
    assert groups.data_version.counter == 7

    assert groups.observe("legacy", CLUSTERING, ["orders"], now_ms=20, model=OFFSETS)
    assert groups.get("legacy").model == OFFSETS  # type: ignore[union-attr]
    assert groups.use_model("migrating", RECEIVE, now_ms=20).model == RECEIVE
    assert groups.get("migrating").created_ms == 11  # type: ignore[union-attr]


def test_an_operator_changes_named_settings_only(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.use_model("r", RECEIVE, now_ms=1)
    exponential = RetryPolicy(delays_ms=(), initial_ms=500, max_ms=60_000, multiplier=3.0)
    g = groups.update("r", max_delivery_attempts=3, retry_policy=exponential, now_ms=2)
    assert (g.settings.max_delivery_attempts, g.settings.retry_policy) == (3, exponential)
    assert (g.settings.fifo, g.settings.consume_enabled, g.model) == (False, True, RECEIVE)
    g = groups.update("r", fifo=True, consume_enabled=False, now_ms=3)
    assert g.settings == GroupSettings(3, exponential, fifo=True, consume_enabled=False)
    assert reopen(groups).get("r") == g  # the exponential policy survives the file too

    # Unknown: created with the defaults first; the model stays for the first use to decide.
    new = groups.update("later", fifo=True, now_ms=4)
    assert (new.model, new.created_ms, new.settings) == (UNSPECIFIED, 4, GroupSettings(fifo=True))


def test_an_operator_moves_a_group_to_the_other_model(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.use_model("g", RECEIVE, now_ms=1)
    groups.update("g", model=OFFSETS, now_ms=2)
    groups.check_model("g", OFFSETS)  # pulls and commits work now
    assert groups.observe("g", CLUSTERING, ["orders"], now_ms=3, model=OFFSETS)
    with pytest.raises(ServiceError) as err:
        groups.use_model("g", RECEIVE, now_ms=4)
    assert_mismatch(err, "g", "receive")


@pytest.mark.parametrize(
    "change",
    [
        {"max_delivery_attempts": 0},
        {"max_delivery_attempts": 1001},
        {"max_delivery_attempts": -3},
        {"model": 7},
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    tmp_path: Path, change: dict[str, int]
) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.update("r", max_delivery_attempts=5, now_ms=1)
    before, version = groups.get("r"), groups.data_version.counter
    with pytest.raises(ValueError, match="must be"):
        groups.update("r", now_ms=2, **change)  # type: ignore[arg-type]
    assert groups.get("r") == before and groups.data_version.counter == version
    assert reopen(groups).get("r") == before


def test_the_limits_of_delivery_attempts_are_inclusive() -> None:
    assert GroupSettings(max_delivery_attempts=1).max_delivery_attempts == 1
    assert GroupSettings(max_delivery_attempts=1000).max_delivery_attempts == 1000


def test_a_receive_group_needs_a_name_its_dead_letter_topic_can_carry(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    with pytest.raises(ServiceError) as err:
        groups.use_model("team a/billing", RECEIVE, now_ms=1)
    assert (err.value.status, err.value.code) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        common_pb2.INVALID_ARGUMENT,
    )
    assert "%DLQ%team a/billing" in str(err.value)
    with pytest.raises(ValueError, match="dead-letter topic"):
        groups.update("x" * 123, model=RECEIVE, now_ms=1)
    assert groups.all() == []
    # Offsets groups have no dead-letter queue: any name they had before still works.
    assert groups.observe("team a/billing", CLUSTERING, ["orders"], now_ms=1, model=OFFSETS)


def test_delete_forgets_the_group(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.update("r", fifo=True, model=RECEIVE, now_ms=1)
    version = groups.data_version.counter
    assert groups.delete("r") is True
    assert groups.get("r") is None and groups.data_version.counter == version + 1
    assert reopen(groups).get("r") is None
    assert groups.delete("r") is False
    # The next use starts over with the defaults, and either model.
    assert groups.observe("r", CLUSTERING, ["orders"], now_ms=2, model=OFFSETS)
    assert groups.get("r").settings == GroupSettings()  # type: ignore[union-attr]


def test_a_damaged_setting_in_the_file_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    bad = {
        "groups": [
            {
                "group": "r",
                "mode": 1,
                "model": 2,
                "settings": {"max_delivery_attempts": 0, "fifo": False},
            }
        ]
    }
    (config / FILE_NAME).write_text(json.dumps(bad))
    with pytest.raises(StateFileError) as err:
        SubscriptionGroupManager(str(tmp_path))
    assert FILE_NAME in str(err.value) and "max_delivery_attempts must be 1..1000" in str(err.value)


# ------------------------------------------------------------------ on the wire, config sync
class Broker:
    def __init__(self, root: Path) -> None:
        self.topics = TopicManager(str(root))
        self.groups = SubscriptionGroupManager(str(root))
        self.offsets = OffsetManager(str(root))
        self.sync = ConfigSync(self.topics, self.groups, self.offsets, 3000, 60000, lambda: None)

    def pull_from(self, master: Broker) -> None:
        request = self.sync.request(full=False)
        m = master
        self.sync.apply(config_sync.answer(request, m.topics, m.groups, m.offsets, topic_proto))


def test_model_and_settings_reach_the_slave_by_config_sync(tmp_path: Path) -> None:
    master, slave = Broker(tmp_path / "m"), Broker(tmp_path / "s")
    master.groups.use_model("r", RECEIVE, now_ms=1, topics=["orders"])
    policy = RetryPolicy(delays_ms=(250, 750))
    master.groups.update("r", max_delivery_attempts=4, retry_policy=policy, fifo=True, now_ms=2)
    master.groups.observe("o", CLUSTERING, ["orders"], now_ms=3, model=OFFSETS)

    slave.pull_from(master)
    assert slave.groups.all() == master.groups.all()
    assert slave.groups.data_version == master.groups.data_version
    r = slave.groups.get("r")
    assert r is not None and r.model == RECEIVE
    assert r.settings == GroupSettings(4, policy, fifo=True, consume_enabled=True)
    assert reopen(slave.groups).all() == master.groups.all()  # and on the slave's disk

    master.groups.update("r", consume_enabled=False, now_ms=4)
    master.groups.delete("o")
    slave.pull_from(master)
    assert slave.groups.get("r").settings.consume_enabled is False  # type: ignore[union-attr]
    assert slave.groups.get("o") is None
    with pytest.raises(ServiceError):
        slave.groups.check_model("r", OFFSETS)  # the slave refuses pulls of the receive group


def test_a_master_older_than_settings_gives_the_defaults() -> None:
    old = broker_pb2.SubscriptionGroup(group="g", mode=1, topics=["orders"], created_ms=3)
    g = group_of(old)
    assert (g.model, g.settings) == (UNSPECIFIED, GroupSettings())
    again = group_of(broker_pb2.SubscriptionGroup.FromString(group_proto(g).SerializeToString()))
    assert again == g
