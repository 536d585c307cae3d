"""A store set aside and started again empty at a later CommitLog offset (a slave resynchronising
after its master's retention): nothing is deleted, and the new log takes replicated bytes from
that offset, serves them, and survives a restart."""

import os
from pathlib import Path

import pytest

from tests.store.conftest import tiny_config
from tidemq.storage import Message, MessageStore
from tidemq.storage.errors import StoreError

pytestmark = pytest.mark.store


def test_restart_empty_at_a_later_file_keeps_the_old_data_and_takes_bytes_from_there(
    tmp_path: Path,
) -> None:
    source_cfg = tiny_config(tmp_path / "master")
    with MessageStore(source_cfg, disk_usage_ratio=lambda: 0.0) as master:
        for i in range(60):
            master.put_messages([Message("t", f"m{i}".encode() * 50, queue_id=0, keys=[f"k{i}"])])
        assert master.wait_dispatched(master.commitlog.max_offset, 10)
        start = master.commitlog.mfq.files[3].base_offset
        tail = master.read_raw(start, master.commitlog.max_offset - start)
        first_q = master.get_messages("t", 0, 0, max_count=200).messages
        first_q = [m for m in first_q if m.phy_offset >= start]

    cfg = tiny_config(tmp_path / "slave")
    with MessageStore(cfg, disk_usage_ratio=lambda: 0.0) as slave:
        slave.put_messages([Message("t", b"old", queue_id=0)]).wait()
        assert slave.wait_dispatched(slave.commitlog.max_offset, 10)
        with pytest.raises(StoreError, match="file boundary"):
            slave.restart_empty_at(start + 1)
        aside = slave.restart_empty_at(start, extra=("epochs",))
        assert os.path.isfile(os.path.join(aside, "commitlog", "0" * 20))
        assert os.path.isdir(os.path.join(aside, "consumequeue", "t", "0"))
        assert slave.commitlog.min_offset == slave.commitlog.max_offset == start
        assert slave.set_asides == 1
        at = start
        while at < start + len(tail):  # replicated chunks never span two files
            n = min(1000, cfg.commitlog_file_size_bytes - at % cfg.commitlog_file_size_bytes)
            at = slave.append_raw(at, tail[at - start : at - start + n])
        assert slave.wait_dispatched(slave.commitlog.max_offset, 10)
        lo = slave.min_offset("t", 0)
        got = slave.get_messages("t", 0, lo, max_count=200).messages
        assert [m.body for m in got] == [m.body for m in first_q]
        assert slave.query_by_key("t", "k59")
    with MessageStore(cfg, disk_usage_ratio=lambda: 0.0) as again:
        assert again.commitlog.min_offset == start
        assert again.min_offset("t", 0) == lo
        assert [m.body for m in again.get_messages("t", 0, lo, max_count=200).messages] == [
            m.body for m in first_q
        ]
