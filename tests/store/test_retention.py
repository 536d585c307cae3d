"""Retention by time and by disk usage (injected), and what readers see afterwards."""

import os
import time
from pathlib import Path

import pytest

from tests.store.conftest import tiny_config
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.retention import wire_retention_floors
from tidemq.storage import Message, MessageStore, PutStatus
from tidemq.storage.errors import DiskFullError, OffsetBelowMinError
from tidemq.storage.retention import Held

pytestmark = pytest.mark.store

HOUR = 3600.0


def fill(store: MessageStore, n: int) -> None:
    for i in range(n):
        store.put_messages([Message("t", b"x" * 300, queue_id=0, keys=[f"k{i}"])])
    assert store.wait_dispatched(store.commitlog.max_offset, 10)


def age_files(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for name in os.listdir(root / "commitlog"):
        os.utime(root / "commitlog" / name, (past, past))


def test_expired_files_go_at_the_delete_hour_queues_and_index_follow(tmp_path: Path) -> None:
    usage = [0.10]
    cfg = tiny_config(
        tmp_path / "s", delete_when_hours=(time.localtime().tm_hour,), delete_file_batch_max=3
    )
    with MessageStore(cfg, disk_usage_ratio=lambda: usage[0]) as s:
        fill(s, 100)
        files_before = len(s.commitlog.mfq.files)
        assert s.run_retention() == 0  # nothing is 72 hours old yet
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() == 3  # at most delete_file_batch_max per pass
        while s.run_retention():
            pass
        assert len(s.commitlog.mfq.files) == 1  # the newest file is never deleted
        assert files_before > 4
        lo = s.min_offset("t", 0)
        assert lo > 0
        with pytest.raises(OffsetBelowMinError) as e:
            s.get_messages("t", 0, 0)
        assert e.value.min_offset == lo
        got = s.get_messages("t", 0, lo, max_count=100)
        assert got.messages and got.messages[0].queue_offset == lo
        assert len(os.listdir(tmp_path / "s" / "consumequeue" / "t" / "0")) < 7
        assert s.query_by_key("t", "k0") == []
        assert s.query_by_key("t", "k99")
    with MessageStore(cfg) as s:  # min offsets survive a restart
        assert s.min_offset("t", 0) == lo


def test_disk_ratio_thresholds(tmp_path: Path) -> None:
    usage = [0.50]
    cfg = tiny_config(tmp_path / "s", delete_when_hours=((time.localtime().tm_hour + 12) % 24,))
    with MessageStore(cfg, disk_usage_ratio=lambda: usage[0]) as s:
        fill(s, 60)
        assert s.run_retention() == 0  # not the hour, usage low
        usage[0] = 0.80
        assert s.run_retention() == 0  # deletes only expired files, none are
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() > 0
        fill(s, 40)
        usage[0] = 0.87
        n = len(s.commitlog.mfq.files)
        assert s.run_retention() > 0  # above 85 %: even files written seconds ago
        assert len(s.commitlog.mfq.files) < n
        usage[0] = 0.92
        s.run_retention()
        with pytest.raises(DiskFullError) as e:
            s.put_messages([Message("t", b"refused")])
        assert e.value.retriable
        usage[0] = 0.60
        s.run_retention()
        assert s.put_messages([Message("t", b"accepted again")]).wait(30) is PutStatus.PUT_OK


def test_undispatched_files_are_never_deleted(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s")
    with MessageStore(cfg, disk_usage_ratio=lambda: 0.88) as s:
        with s.dispatch_held():  # hold dispatch back, as if it lagged
            s.put_messages([Message("t", b"y" * 500) for _ in range(30)])
            assert s.run_retention() == 0
        assert s.wait_dispatched(s.commitlog.max_offset, 10)


def test_forced_retention_stops_at_the_replica_floor_until_the_slave_acknowledges(
    tmp_path: Path,
) -> None:
    acked = [0]
    with MessageStore(tiny_config(tmp_path / "s"), disk_usage_ratio=lambda: 0.87) as s:
        s.set_retention_floors(replicas=lambda: acked[0])
        fill(s, 60)
        files = [f.base_offset for f in s.commitlog.mfq.files]
        assert len(files) > 4
        acked[0] = files[2] + 10  # the slave holds the first two files and part of the third
        assert s.run_retention() == 2
        assert s.commitlog.min_offset == files[2]
        assert s.run_retention() == 0  # the third file waits for the slave
        assert s.retention_counts.held[Held.UNREPLICATED] == 1  # counted once per file
        acked[0] = s.commitlog.max_offset
        assert s.run_retention() > 0
        assert s.commitlog.min_offset > files[2]


def test_forced_retention_keeps_what_a_group_has_not_read_and_counts_it(tmp_path: Path) -> None:
    committed = [0]
    usage = [0.87]
    with MessageStore(tiny_config(tmp_path / "s"), disk_usage_ratio=lambda: usage[0]) as s:
        s.set_retention_floors(consumers=lambda: [("t", 0, committed[0])])
        fill(s, 60)
        assert s.run_retention() == 0  # the group has read nothing
        assert s.retention_counts.held[Held.UNCONSUMED] == 1
        assert s.min_offset("t", 0) == 0
        usage[0] = 0.92  # the disk fills: writes are refused, the unread files stay
        assert s.run_retention() == 0
        with pytest.raises(DiskFullError):
            s.put_messages([Message("t", b"refused")])
        assert s.retention_counts.held[Held.UNCONSUMED] == 1  # the same file, counted once
        usage[0] = 0.87
        committed[0] = 30
        assert s.run_retention() > 0  # files wholly below message 30 go
        lo = s.min_offset("t", 0)
        assert 0 < lo <= 30
        got = s.get_messages("t", 0, lo, max_count=100)
        assert got.messages[0].queue_offset == lo
        assert s.retention_counts.unconsumed_deleted == 0


def test_force_delete_unconsumed_deletes_unread_files_and_counts_each(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "s", force_delete_unconsumed=True)
    with MessageStore(cfg, disk_usage_ratio=lambda: 0.87) as s:
        s.set_retention_floors(consumers=lambda: [("t", 0, 0)])
        fill(s, 60)
        n = s.run_retention()
        assert n > 0
        assert s.retention_counts.unconsumed_deleted == n
        assert s.retention_counts.held[Held.UNCONSUMED] == 0
        assert s.min_offset("t", 0) > 0


def test_a_pinned_position_keeps_its_record_through_aged_and_forced_passes(
    tmp_path: Path,
) -> None:
    usage = [0.10]
    cfg = tiny_config(
        tmp_path / "s",
        delete_when_hours=(time.localtime().tm_hour,),
        force_delete_unconsumed=True,
    )
    pins: list[tuple[str, int, int]] = [("t", 0, 0)]
    with MessageStore(cfg, disk_usage_ratio=lambda: usage[0]) as s:
        s.set_retention_floors(pinned=lambda: pins)
        fill(s, 60)
        age_files(tmp_path / "s", 73 * HOUR)  # every file has expired
        assert s.run_retention() == 0  # the pending record is in the first file
        assert s.retention_counts.held[Held.PINNED] == 1
        usage[0] = 0.87  # forced, and unconsumed data may go: still kept
        assert s.run_retention() == 0
        assert s.retention_counts.held[Held.PINNED] == 1  # the same file, counted once
        pins[0] = ("t", 0, 30)
        assert s.run_retention() > 0
        lo = s.min_offset("t", 0)
        assert 0 < lo <= 30  # the record at queue offset 30 is still readable
        assert s.get_messages("t", 0, 30, max_count=1).messages[0].queue_offset == 30
        assert s.retention_counts.held[Held.PINNED] == 2
        # Nothing pending (the position at its queue's end, or a queue that does not exist).
        pins[:] = [("t", 0, s.max_offset("t", 0)), ("absent", 0, 0)]
        while s.run_retention():
            pass
        assert len(s.commitlog.mfq.files) == 1


def test_the_brokers_pins_reach_the_store_and_none_pins_nothing(tmp_path: Path) -> None:
    usage = [0.87]
    cfg = tiny_config(tmp_path / "s", force_delete_unconsumed=True)
    timer: list[tuple[str, int, int] | None] = [("t", 0, 10)]
    with MessageStore(cfg, disk_usage_ratio=lambda: usage[0]) as s:
        wire_retention_floors(
            s,
            lambda: None,
            OffsetManager(str(tmp_path / "broker")),
            pinned=[lambda: timer[0], lambda: None],
        )
        fill(s, 60)
        assert s.run_retention() > 0
        lo = s.min_offset("t", 0)
        assert 0 < lo <= 10
        assert s.retention_counts.held[Held.PINNED] == 1
        timer[0] = None  # nothing pending any more
        while s.run_retention():
            pass
        assert len(s.commitlog.mfq.files) == 1
