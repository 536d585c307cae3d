"""Configuration validation and the retention rules as a table."""

import pytest

from tidemq.storage.config import StoreConfig, parse_host
from tidemq.storage.errors import ConfigError
from tidemq.storage.retention import decide, expired_file_count

pytestmark = pytest.mark.unit


def test_defaults_are_rocketmqs() -> None:
    c = StoreConfig("/tmp/x")
    assert c.commitlog_file_size_bytes == 1 << 30
    assert c.consume_queue_file_size_bytes == 6_000_000
    assert (c.index_slot_num, c.index_max_num) == (5_000_000, 20_000_000)
    assert c.max_message_body_bytes == 4 << 20
    assert (c.file_reserved_time_hours, c.delete_when_hours) == (72.0, (4,))
    assert c.store_host_packed == (bytes([127, 0, 0, 1]), 10911)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"commitlog_file_size_bytes": 100},
        {"consume_queue_entries_per_file": 0},
        {"flush_interval_ms": 0},
        {"delete_when_hours": (25,)},
        {"disk_max_used_space_ratio": 0.95},  # above the force ratio
        {"store_host": "localhost"},
        {"store_host": "1.2.3.4:99999"},
    ],
)
def test_invalid_config_is_refused_with_every_problem_named(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="invalid store config"):
        StoreConfig("/tmp/x", **kwargs)  # type: ignore[arg-type]


def test_parse_host_v4_and_v6() -> None:
    assert parse_host("10.1.2.3:80") == (bytes([10, 1, 2, 3]), 80)
    assert parse_host("[::1]:5") == (bytes(15) + b"\x01", 5)


@pytest.mark.parametrize(
    ("usage", "hour", "delete", "force", "full"),
    [
        (0.10, 3, False, False, False),
        (0.10, 4, True, False, False),  # the configured deletion hour
        (0.76, 3, True, False, False),  # above 75 %: delete expired files
        (0.86, 3, True, True, False),  # above 85 %: delete even unexpired files
        (0.91, 3, True, True, True),  # above 90 %: refuse writes too
    ],
)
def test_retention_decision_table(
    usage: float, hour: int, delete: bool, force: bool, full: bool
) -> None:
    d = decide(StoreConfig("/tmp/x"), usage, hour)
    assert (d.delete, d.force, d.disk_full) == (delete, force, full)


def test_expired_files_oldest_first_stop_at_first_unexpired_and_batch_max() -> None:
    now, keep = 1000.0, 100.0
    assert expired_file_count([100, 200, 950, 300], now, keep, force=False, batch_max=10) == 2
    assert expired_file_count([100, 200, 950, 300], now, keep, force=True, batch_max=10) == 4
    assert expired_file_count([1] * 20, now, keep, force=False, batch_max=10) == 10
