"""The broker's runtime settings (validation, persistence, a slave taking its master's), its
daily statistics and the clean-up of deleted topics' offsets, without sockets: state files in a
temporary directory and made-up clocks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.daily_stats import DailyStats, day_of
from tidemq.services.broker.offset_cleanup import DeletedTopicOffsets
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.runtime_config import RuntimeConfig, RuntimeConfigError
from tidemq.storage import StoreConfig
from tidemq.storage.errors import ConfigError

pytestmark = pytest.mark.unit

DAY_MS = 86_400_000


def configs(tmp_path: Path) -> tuple[BrokerConfig, StoreConfig]:
    return BrokerConfig(str(tmp_path)), StoreConfig(str(tmp_path))


def test_a_change_applies_to_the_live_objects_and_survives_a_restart(tmp_path: Path) -> None:
    broker, store = configs(tmp_path)
    rc = RuntimeConfig(broker, store, str(tmp_path))
    changed = rc.update({"max_pull_response_bytes": "1_048_576", "delete_when_hours": "3,4"})
    assert sorted(changed) == ["delete_when_hours", "max_pull_response_bytes"]
    assert broker.max_pull_response_bytes == 1 << 20 and store.delete_when_hours == (3, 4)
    assert rc.update({"max_pull_response_bytes": "1048576"}) == []  # same value: no change
    stored = json.loads((tmp_path / "config" / "runtimeConfig.json").read_text())
    assert stored == {"settings": {"delete_when_hours": [3, 4], "max_pull_response_bytes": 1 << 20}}

    again_broker, again_store = configs(tmp_path)
    again = RuntimeConfig(again_broker, again_store, str(tmp_path))
    assert again_broker.max_pull_response_bytes == 1 << 20 and again_store.delete_when_hours == (
        3,
        4,
    )
    entry = {e.key: e for e in again.entries()}["max_pull_response_bytes"]
    assert (entry.value, entry.file_value, entry.changeable) == ("1048576", "4194304", True)
    # An empty value puts the file's value back.
    again.update({"max_pull_response_bytes": ""})
    assert again_broker.max_pull_response_bytes == 4 << 20
    assert "secret_key" not in {e.key for e in again.entries()}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"listen": "1.2.3.4:5"}, "listen cannot change while the broker runs"),
        ({"flush_interval_ms": "5"}, "flush_interval_ms cannot change"),
        ({"no_such_thing": "1"}, "unknown setting 'no_such_thing'"),
        ({"long_poll_max_ms": "soon"}, "long_poll_max_ms: 'soon' is not a valid value"),
        ({"force_delete_unconsumed": "maybe"}, "force_delete_unconsumed"),
        ({"long_poll_max_ms": "0"}, "long_poll_max_ms must be > 0"),
        ({"max_pull_response_bytes": str(1 << 40)}, "max_pull_response_bytes must be <="),
        ({"disk_max_used_space_ratio": "0.95"}, "disk ratios"),
    ],
)
def test_a_bad_change_names_the_key_and_changes_nothing(
    tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    broker, store = configs(tmp_path)
    rc = RuntimeConfig(broker, store, str(tmp_path))
    with pytest.raises(RuntimeConfigError, match=re.escape(message)):
        rc.update({**changes, "max_batch_messages": "7"})
    with pytest.raises(RuntimeConfigError, match="no settings given"):
        rc.update({})
    assert broker.max_batch_messages == 1024 and rc.overrides == {}
    assert not (tmp_path / "config" / "runtimeConfig.json").exists()


def test_a_slave_takes_its_masters_settings_and_drops_what_the_master_dropped(
    tmp_path: Path,
) -> None:
    master = RuntimeConfig(*configs(tmp_path / "m"), str(tmp_path / "m"))
    slave_broker, slave_store = configs(tmp_path / "s")
    slave = RuntimeConfig(slave_broker, slave_store, str(tmp_path / "s"))
    master.update({"max_receive_messages": "16", "file_reserved_time_hours": "12.5"})
    assert slave.replace_all(master.to_json()) is True
    assert slave_broker.max_receive_messages == 16 and slave_store.file_reserved_time_hours == 12.5
    assert slave.replace_all(master.to_json()) is False
    master.update({"max_receive_messages": ""})
    assert slave.replace_all(master.to_json()) is True
    assert slave_broker.max_receive_messages == 1024
    # A value the slave refuses leaves it as it was; the sync goes on.
    assert slave.replace_all('{"listen": "x"}') is False
    assert slave_store.file_reserved_time_hours == 12.5


def test_a_damaged_runtime_file_refuses_start_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "runtimeConfig.json").write_text('{"settings": {"listen": "x"}}')
    with pytest.raises(ConfigError, match=r"runtimeConfig\.json"):
        RuntimeConfig(*configs(tmp_path), str(tmp_path))


def test_daily_statistics_count_growth_per_topic_and_day(tmp_path: Path) -> None:
    stats = DailyStats(str(tmp_path), days=2)
    day0 = 20_000 * DAY_MS
    stats.record(day0, {("t", 0): 5}, {("g", "t", 0): 5})  # the baseline counts nothing
    stats.record(day0 + 1000, {("t", 0): 8, ("new", 0): 2, ("%SYS%x", 0): 50}, {("g", "t", 0): 7})
    # Two groups read the same messages: out counts both; a reset (moving back) counts nothing.
    stats.record(day0 + 2000, {("t", 0): 8, ("new", 0): 2}, {("g", "t", 0): 8, ("h", "t", 0): 1})
    stats.record(day0 + 3000, {("t", 0): 8, ("new", 0): 2}, {("g", "t", 0): 2, ("h", "t", 0): 3})
    stats.record(day0 + DAY_MS, {("t", 0): 10, ("new", 0): 2}, {("g", "t", 0): 4, ("h", "t", 0): 3})
    rows = [(r.day, r.topic, r.messages_in, r.messages_out) for r in stats.rows(7)]
    d0, d1 = day_of(day0), day_of(day0 + DAY_MS)
    assert rows == [(d1, "t", 2, 2), (d0, "new", 2, 0), (d0, "t", 3, 5)]
    assert stats.persist() is True and stats.persist() is False
    again = DailyStats(str(tmp_path), days=2)
    assert [(r.day, r.topic) for r in again.rows(1)] == [(d1, "t")]
    # Only the last `days` days are kept.
    again.record(day0 + 2 * DAY_MS, {("t", 0): 1}, {})
    again.record(day0 + 3 * DAY_MS, {("t", 0): 4}, {})
    assert {r.day for r in again.rows(7)} == {d1, day_of(day0 + 3 * DAY_MS)}


def test_offsets_of_a_deleted_topic_go_after_the_grace_period(tmp_path: Path) -> None:
    offsets = OffsetManager(str(tmp_path))
    for topic in ("kept", "gone", "%RETRY%g"):
        offsets.commit("g", topic, 0, 5)
    offsets.commit("h", "gone", 1, 3)
    live = {"kept"}
    cleanup = DeletedTopicOffsets(offsets, lambda: live, grace_ms=60_000)
    assert cleanup.scan(1_000) == []
    assert cleanup.scan(30_000) == []
    # Created again within the grace: its offsets stay and the clock starts over.
    live.add("gone")
    assert cleanup.scan(40_000) == [] and cleanup.gone_since == {}
    live.discard("gone")
    assert cleanup.scan(50_000) == []
    assert cleanup.scan(110_000) == ["gone"]
    assert {(e.group, e.topic) for e in offsets.entries()} == {("g", "kept"), ("g", "%RETRY%g")}
    assert offsets.persist() is True
    assert "gone" not in (tmp_path / "config" / "consumerOffset.json").read_text()
