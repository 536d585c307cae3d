"""Configuration validation and the retention rules as a table."""

import pytest

from tidemq.storage.config import StoreConfig, parse_host
from tidemq.storage.errors import ConfigError
from tidemq.storage.retention import FileFacts, Held, decide, plan_deletions

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


def _files(*mtimes: float) -> list[FileFacts]:
    """Files of 100 bytes each, oldest first, with these modification times."""
    return [FileFacts(i * 100, i * 100 + 100, m) for i, m in enumerate(mtimes)]


def test_expired_files_oldest_first_stop_at_first_unexpired_and_batch_max() -> None:
    now, keep = 1000.0, 100.0
    files = _files(100, 200, 950, 300)
    assert plan_deletions(files, now, keep, force=False, batch_max=10).delete == 2
    assert plan_deletions(files, now, keep, force=True, batch_max=10).delete == 4
    assert plan_deletions(_files(*[1] * 20), now, keep, force=False, batch_max=10).delete == 10


# Four files [0,100) .. [300,400); the first two expired (mtime 100), the last two not (950).
NOW, KEEP = 1000.0, 100.0
FILES = _files(100, 100, 950, 950)


@pytest.mark.parametrize(
    ("force", "replica", "consumer", "delete_unconsumed", "deleted", "held", "unconsumed"),
    [
        # Expired files go whatever consumers did; unexpired ones wait unless forced.
        (False, None, 0, False, 2, None, 0),
        # Forced and every group read everything: even unexpired files go.
        (True, None, None, False, 4, None, 0),
        # Forced, a group has read only up to 250: the file it is reading is kept...
        (True, None, 250, False, 2, (200, Held.UNCONSUMED), 0),
        # ... unless deleting unconsumed data is allowed, and then it is counted.
        (True, None, 250, True, 4, None, 2),
        # A slave has acknowledged up to 150: its unreplicated file stays, forced or not.
        (False, 150, None, False, 1, (100, Held.UNREPLICATED), 0),
        (True, 150, None, True, 1, (100, Held.UNREPLICATED), 0),
        # The replica floor is checked before the consumers': it cannot be overridden.
        (True, 250, 0, True, 2, (200, Held.UNREPLICATED), 0),
        # A slave past everything holds nothing back; a file ending at the floor may go.
        (True, 300, None, False, 3, (300, Held.UNREPLICATED), 0),
        (True, 400, None, False, 4, None, 0),
        # Not forced and not expired: the pass just stops there, nothing is held by a floor.
        (False, 300, 0, False, 2, None, 0),
    ],
)
def test_retention_plan_floors_table(
    force: bool,
    replica: int | None,
    consumer: int | None,
    delete_unconsumed: bool,
    deleted: int,
    held: tuple[int, Held] | None,
    unconsumed: int,
) -> None:
    plan = plan_deletions(
        FILES,
        NOW,
        KEEP,
        force=force,
        batch_max=10,
        replica_floor=replica,
        consumer_floor=consumer,
        force_delete_unconsumed=delete_unconsumed,
    )
    assert plan.delete == deleted
    assert (None if plan.held is None else (plan.held[0].base_offset, plan.held[1])) == held
    assert len(plan.unconsumed) == unconsumed


@pytest.mark.parametrize(
    ("force", "pinned", "deleted", "held"),
    [
        # Pending state in the second file: the expired file before it goes, it stays.
        (False, 150, 1, (100, Held.PINNED)),
        # A forced pass that may delete unconsumed data still keeps it.
        (True, 150, 1, (100, Held.PINNED)),
        (True, 250, 2, (200, Held.PINNED)),
        # A file ending at the pin holds nothing pending; pinned past the end holds nothing.
        (True, 300, 3, (300, Held.PINNED)),
        (True, 400, 4, None),
        # Not forced and not expired: the pass stops there on its own, no floor is blamed.
        (False, 300, 2, None),
    ],
)
def test_pinned_floor_keeps_pending_state_from_aged_and_forced_passes(
    force: bool, pinned: int, deleted: int, held: tuple[int, Held] | None
) -> None:
    plan = plan_deletions(
        FILES,
        NOW,
        KEEP,
        force=force,
        batch_max=10,
        force_delete_unconsumed=True,
        pinned_floor=pinned,
    )
    assert plan.delete == deleted
    assert (None if plan.held is None else (plan.held[0].base_offset, plan.held[1])) == held


@pytest.mark.parametrize(
    ("force", "archived_to", "deleted", "held"),
    [
        # Nothing archived yet: the expired files stay, blamed on the archive.
        (False, 0, 0, (0, Held.UNARCHIVED)),
        # The first file archived: it goes, the second waits for its upload.
        (False, 100, 1, (100, Held.UNARCHIVED)),
        # Even a forced pass (a full disk) deletes nothing that is not archived.
        (True, 200, 2, (200, Held.UNARCHIVED)),
        (True, 400, 4, None),
        # Archived but not expired and not forced: the pass stops on its own.
        (False, 400, 2, None),
    ],
)
def test_archive_floor_keeps_what_is_not_archived_from_aged_and_forced_passes(
    force: bool, archived_to: int, deleted: int, held: tuple[int, Held] | None
) -> None:
    plan = plan_deletions(
        FILES,
        NOW,
        KEEP,
        force=force,
        batch_max=10,
        force_delete_unconsumed=True,
        archive_floor=archived_to,
    )
    assert plan.delete == deleted
    assert (None if plan.held is None else (plan.held[0].base_offset, plan.held[1])) == held
