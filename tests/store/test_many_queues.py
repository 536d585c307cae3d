"""Stores with many queues (docs/storage.md, "Many queues"): every queue reads back after a
restart, a flush visits only the queues written since the last one, and no more ConsumeQueue
files are mapped than the configured bound however many queues are read or written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tidemq.storage import Message, MessageStore, StoreConfig
from tidemq.storage.errors import ConfigError

pytestmark = pytest.mark.store

# Housekeeping never runs during a test: what the tests count is their own flushes.
_QUIET = 3_600_000


def config(root: Path, **kw: Any) -> StoreConfig:
    settings: dict[str, Any] = {
        "commitlog_file_size_bytes": 8 << 20,
        "consume_queue_entries_per_file": 2,
        "message_index_enable": False,
        "checkpoint_interval_ms": _QUIET,
        "consume_queue_flush_interval_ms": _QUIET,
        "clean_resource_interval_ms": _QUIET,
    }
    settings.update(kw)
    return StoreConfig(str(root), **settings)


def body(topic: str, qid: int, n: int) -> bytes:
    return f"{topic}/{qid}/{n}".encode()


def fill(s: MessageStore, queues: list[tuple[str, int]], per_queue: int) -> None:
    batch: list[Message] = []
    for n in range(per_queue):
        for topic, qid in queues:
            batch.append(Message(topic=topic, queue_id=qid, body=body(topic, qid, n)))
            if len(batch) == 1000:
                s.put_messages(batch)
                batch = []
    if batch:
        s.put_messages(batch)
    s.dispatch_now()


def read_back(s: MessageStore, queues: list[tuple[str, int]], per_queue: int, bound: int) -> None:
    for topic, qid in queues:
        got = s.get_messages(topic, qid, 0, max_count=per_queue + 1)
        assert [m.body for m in got.messages] == [body(topic, qid, n) for n in range(per_queue)]
        assert s.max_offset(topic, qid) == per_queue
        assert s.queues.open_files <= bound


def mapped_queue_files(root: Path) -> int:
    """ConsumeQueue files this process has mapped, as the kernel lists them."""
    cq = f"{root}/consumequeue/"
    with open("/proc/self/maps") as maps:
        return len({line.split()[-1] for line in maps if cq in line})


def test_twenty_thousand_queues_reopen_and_read_back(tmp_path: Path) -> None:
    """5,000 topics x 4 queues, each with messages: far more queues than files may be mapped
    at once (and than the descriptor limit would allow if each stayed mapped)."""
    queues = [(f"t{t}", q) for t in range(5_000) for q in range(4)]
    cfg = config(tmp_path / "s", consume_queue_max_open_files=256)
    with MessageStore(cfg) as s:
        fill(s, queues, 2)
        assert s.queues.open_files <= 256
    with MessageStore(cfg) as s:
        assert s.queues.maps == 0  # nothing is mapped until a queue is used
        assert s.stats().queues == len(queues)
        read_back(s, queues, 2, 256)
        assert mapped_queue_files(tmp_path / "s") <= 256


def test_a_flush_after_writing_one_queue_of_many_visits_only_that_queue(tmp_path: Path) -> None:
    queues = [(f"t{t}", q) for t in range(500) for q in range(4)]
    with MessageStore(config(tmp_path / "s")) as s:
        fill(s, queues, 1)
        s.queues.flush()
        assert s.queues.dirty_count == 0
        visits = s.queues.flush_visits
        s.queues.flush()
        assert s.queues.flush_visits == visits  # idle queues cost a flush nothing
        s.put_message(Message(topic="t7", queue_id=3, body=b"one more"))
        s.dispatch_now()
        assert s.queues.dirty_count == 1
        s.queues.flush()
        assert s.queues.flush_visits == visits + 1
        assert s.queues.dirty_count == 0


def test_mapped_files_stay_under_the_bound_while_writing_and_reading(tmp_path: Path) -> None:
    """Writes round-robin over more queues than the bound: queues are unmapped with bytes not yet
    synced, and the next flush still syncs them (nothing stays dirty)."""
    queues = [("wide", q) for q in range(300)]
    with MessageStore(config(tmp_path / "s", consume_queue_max_open_files=16)) as s:
        fill(s, queues, 5)  # 3 files per queue
        assert s.queues.open_files <= 16
        assert s.queues.unmaps > 0
        assert mapped_queue_files(tmp_path / "s") <= 16
        s.queues.flush()
        assert s.queues.dirty_count == 0
        read_back(s, queues, 5, 16)
        assert mapped_queue_files(tmp_path / "s") <= 16


def test_a_topic_with_1024_queues_round_trips(tmp_path: Path) -> None:
    queues = [("big", q) for q in range(1024)]
    cfg = config(tmp_path / "s", consume_queue_max_open_files=64)
    with MessageStore(cfg) as s:
        fill(s, queues, 3)
        read_back(s, queues, 3, 64)
    with MessageStore(cfg) as s:
        read_back(s, queues, 3, 64)
        fill(s, queues, 1)  # the next offsets come from the queues, read as they are used
        for _, qid in queues:
            assert s.queue_entries("big", qid, 3, 1)[0].queue_offset == 3
        assert s.max_offset("big", 1023) == 4


def test_truncation_reaches_unmapped_queues(tmp_path: Path) -> None:
    """A replica cutting its log back: queues unmapped at the time lose their entries past the
    cut too, now and after a restart."""
    queues = [("cut", q) for q in range(40)]
    cfg = config(tmp_path / "s", consume_queue_max_open_files=4)
    with MessageStore(cfg) as s:
        fill(s, queues, 2)
        cut = s.dispatched_offset
        fill(s, queues, 1)  # a third message per queue, all past the cut
        assert s.queues.open_files <= 4
        s.truncate_to(cut, "test")
        for _, qid in queues:
            assert s.max_offset("cut", qid) == 2
    with MessageStore(cfg) as s:
        read_back(s, queues, 2, 4)


def test_a_crash_recovers_queues_mapped_later(tmp_path: Path) -> None:
    """After a crash (no clean close), a queue first used long after recovery still reads
    exactly what the log holds: recovery leaves unused queues unmapped."""
    queues = [(f"k{t}", 0) for t in range(200)]
    cfg = config(tmp_path / "s", consume_queue_max_open_files=8)
    s = MessageStore(cfg).open()
    fill(s, queues, 3)
    s.queues.flush()
    s.flush_commitlog()
    # A kill: the threads stop, files stay as they are, the abort file stays.
    s._lifecycle._stop_services()
    s._lifecycle.stop_event.set()
    for t in s._lifecycle.threads:
        t.join()
    s._parts.close_files()
    s._lifecycle.lock.release()
    assert os.path.exists(tmp_path / "s" / "abort")
    with MessageStore(cfg) as s2:
        assert s2.recovery is not None and s2.recovery.abnormal
        read_back(s2, queues, 3, 8)


def test_the_bound_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="consume_queue_max_open_files"):
        config(tmp_path / "s", consume_queue_max_open_files=0)
