"""The broker's state tables and config, without sockets."""

import asyncio
from pathlib import Path

import pytest

from tidemq.replication import SlaveFlush
from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerRole, load
from tidemq.services.broker.convert import parse_tag_expression
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.publication import RegistrationRounds
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.errors import ServiceError
from tidemq.storage.errors import ConfigError, InvalidTopicError

pytestmark = pytest.mark.unit


def test_topics_persist_atomically_and_bump_the_data_version(tmp_path: Path) -> None:
    tm = TopicManager(str(tmp_path))
    assert tm.upsert(TopicConfig("orders", 4, 4))
    v1 = tm.data_version.counter
    assert not tm.upsert(TopicConfig("orders", 4, 4))  # unchanged: no new version
    assert tm.data_version.counter == v1
    assert not tm.upsert(TopicConfig("orders", 8, 8))  # updated, not created
    assert tm.data_version.counter == v1 + 1
    again = TopicManager(str(tmp_path))
    assert again.get("orders") == TopicConfig("orders", 8, 8)
    assert again.data_version.counter == v1 + 1
    assert again.delete("orders") and not again.delete("orders")
    assert TopicManager(str(tmp_path)).get("orders") is None


@pytest.mark.parametrize(
    "cfg",
    [TopicConfig("orders", 0, 4), TopicConfig("orders", 4, 2000), TopicConfig("orders", 4, 4, 8)],
)
def test_bad_topic_configs_are_refused(tmp_path: Path, cfg: TopicConfig) -> None:
    with pytest.raises(ValueError, match=r"queue_nums|perm"):
        TopicManager(str(tmp_path)).upsert(cfg)


def test_bad_topic_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopicError):
        TopicManager(str(tmp_path)).upsert(TopicConfig("no spaces"))


def test_offsets_survive_a_restart_after_persist(tmp_path: Path) -> None:
    om = OffsetManager(str(tmp_path))
    om.commit("g", "orders", 0, 42)
    om.commit("g", "orders", 1, 7)
    assert om.persist() and not om.persist()  # nothing new the second time
    again = OffsetManager(str(tmp_path))
    assert again.query("g", "orders", 0) == 42
    assert again.query("g", "orders", 1) == 7
    assert again.query("other", "orders", 0) is None


def test_a_consumer_commit_never_moves_an_offset_back_but_a_reset_does(tmp_path: Path) -> None:
    om = OffsetManager(str(tmp_path))
    assert om.commit("g", "orders", 0, 42) == 42
    # A member that lost the queue in a rebalance commits its older position late.
    assert om.commit("g", "orders", 0, 30) == 42
    assert om.query("g", "orders", 0) == 42
    assert om.commit("g", "orders", 0, 50) == 50
    assert om.commit("g", "orders", 0, 0, reset=True) == 0
    assert om.query("g", "orders", 0) == 0


def test_group_members_expire_and_are_sorted() -> None:
    reg = ClientRegistry(expiry_ms=1000)
    reg.heartbeat("c2", "g", 1, {"orders": "*"}, now_ms=0)
    reg.heartbeat("c1", "g", 1, {"orders": "*"}, now_ms=500)
    assert reg.members("g", now_ms=900) == ["c1", "c2"]
    assert reg.members("g", now_ms=1200) == ["c1"]
    assert reg.expire(now_ms=1200) == ["c2"]
    reg.unregister("c1")
    assert reg.members("g", now_ms=1200) == []


@pytest.mark.parametrize(
    ("expr", "tags"), [("*", None), ("", None), ("a", ["a"]), (" a || b ", ["a", "b"])]
)
def test_tag_expressions(expr: str, tags: list[str] | None) -> None:
    assert parse_tag_expression(expr) == tags


@pytest.mark.parametrize("expr", ["a ||", "|| b", "a || * "])
def test_bad_tag_expressions(expr: str) -> None:
    with pytest.raises(ServiceError):
        parse_tag_expression(expr)


def test_config_from_toml_with_flags_on_top(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text(
        'store_dir = "/var/lib/tidemq"\nbroker_name = "b1"\nrole = "sync_master"\n'
        'nameservers = ["10.0.0.1:9876", "ns2.example:9876"]\n'
    )
    cfg = load(str(f), {"broker_name": "b2", "listen": None})
    assert (cfg.broker_name, cfg.role, cfg.listen) == (
        "b2",
        BrokerRole.SYNC_MASTER,
        "127.0.0.1:10911",
    )
    assert cfg.nameservers == ("10.0.0.1:9876", "ns2.example:9876")


def test_replication_settings_come_in_their_own_table_with_flags_on_top(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text('store_dir = "/s"\n[replication]\nchunk_bytes = 1048576\nsync_timeout_ms = 500\n')
    cfg = load(str(f), {"replication": {"sync_timeout_ms": 800, "confirm_offset": None}})
    assert (cfg.replication.chunk_bytes, cfg.replication.sync_timeout_ms) == (1 << 20, 800)
    assert cfg.replication.confirm_offset is False  # a flag not given changes nothing
    assert cfg.replication.report_interval_ms == 5_000  # the replication default, stated once


def test_slave_flush_is_async_by_default_and_sync_from_toml(tmp_path: Path) -> None:
    assert load(None, {"store_dir": "/s"}).replication.slave_flush is SlaveFlush.ASYNC
    f = tmp_path / "broker.toml"
    f.write_text('store_dir = "/s"\n[replication]\nslave_flush = "sync"\n')
    assert load(str(f), {}).replication.slave_flush is SlaveFlush.SYNC


@pytest.mark.parametrize(
    "overrides",
    [
        {"store_dir": "/s", "replication": {"chunk_size": 1}},
        {"store_dir": "/s", "replication": {"slave_flush": "sometimes"}},
        {"store_dir": "/s", "replication": {"idle_timeout_ms": 1000}},
        {"store_dir": "/s", "ha_chunk_bytes": 1},
        {"store_dir": "/s", "role": "SLAVE", "broker_id": 0},
        {"store_dir": "/s", "broker_id": 2},
        {"store_dir": "/s", "listen": "nowhere"},
        {"store_dir": "/s", "nameservers": "a:1,b"},
        {"store_dir": "/s", "colour": "blue"},
    ],
)
def test_bad_configs_are_refused_once(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load(None, overrides)


def test_a_topic_change_made_during_a_registration_round_gets_a_round_of_its_own() -> None:
    async def scenario() -> None:
        rounds = RegistrationRounds()
        first = rounds.request()
        assert await rounds.next_round(interval_s=60) == first  # wanted: no interval wait
        # A change arrives while round `first` is on the wire: that round cannot carry it.
        during = rounds.request()
        await rounds.finished(first)
        assert not await rounds.published(during, timeout_s=0.05)
        assert await rounds.published(first, timeout_s=0.05)
        # The change was not lost with the finished round: the next one starts at once.
        async with asyncio.timeout(1):
            ticket = await rounds.next_round(interval_s=60)
        assert ticket == during
        waiter = asyncio.create_task(rounds.published(during, timeout_s=5))
        await rounds.finished(ticket)
        assert await waiter

    asyncio.run(scenario())


def test_with_nothing_wanted_a_registration_round_waits_out_its_interval() -> None:
    async def scenario() -> None:
        rounds = RegistrationRounds()
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await rounds.next_round(interval_s=0.05) == 0
        assert loop.time() - started >= 0.05

    asyncio.run(scenario())
