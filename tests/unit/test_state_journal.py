"""The append-only journal beside topics.json / subscriptionGroup.json (state_journal,
journaled_table): its bytes, replay, a torn last record cut and kept aside, damage in the middle
refused, compaction, and an acknowledged change surviving kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.services.broker import journaled_table, state_journal
from tidemq.services.broker.groups import SubscriptionGroupManager, load_groups
from tidemq.services.broker.topics import DataVersion, TopicConfig, TopicManager, load_topics
from tidemq.storage.state_file import StateFileError


def journal(tmp_path: Path) -> Path:
    return tmp_path / "config" / "topics.json.journal"


def test_record_bytes_are_pinned() -> None:
    """The on-disk format: CRC-32 of the compact sorted-key JSON as 8 hex digits, a space, the
    JSON, a newline. Changing it breaks every journal already written."""
    record = {
        "seq": 1,
        "v": {"state_version": 0, "counter": 1, "timestamp_ms": 1700000000000},
        "put": [
            {
                "topic": "orders",
                "read_queue_nums": 4,
                "write_queue_nums": 4,
                "perm": 6,
                "order": False,
                "attributes": {},
            }
        ],
        "del": [],
    }
    assert state_journal.encode(record) == (
        b'b193caf3 {"del":[],"put":[{"attributes":{},"order":false,"perm":6,'
        b'"read_queue_nums":4,"topic":"orders","write_queue_nums":4}],"seq":1,'
        b'"v":{"counter":1,"state_version":0,"timestamp_ms":1700000000000}}\n'
    )


def test_a_change_appends_one_record_and_a_restart_replays_it(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path))
    topics.upsert(TopicConfig("orders", 4, 4))
    topics.upsert(TopicConfig("audit", 2, 2))
    topics.delete("orders")
    assert not (tmp_path / "config" / "topics.json").exists()  # no snapshot rewrite per change
    lines = journal(tmp_path).read_bytes().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[2].split(b" ", 1)[1]) == {
        "seq": 3,
        "v": {"state_version": 0, "counter": 3, "timestamp_ms": topics.data_version.timestamp_ms},
        "put": [],
        "del": ["orders"],
    }
    again = TopicManager(str(tmp_path))
    assert again.all() == [TopicConfig("audit", 2, 2)]
    assert again.data_version == topics.data_version
    stored = load_topics(str(tmp_path))
    assert stored is not None and stored.topics == [TopicConfig("audit", 2, 2)]


def test_a_torn_last_record_is_cut_and_kept_aside(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path))
    topics.upsert(TopicConfig("orders", 4, 4))
    version = DataVersion(**vars(topics.data_version))
    good = journal(tmp_path).read_bytes()
    torn = state_journal.encode({"seq": 2, "v": {}, "put": [], "del": ["orders"]})[:-9]
    journal(tmp_path).write_bytes(good + torn)  # a crash in the middle of the second append

    assert load_topics(str(tmp_path)).topics == [TopicConfig("orders", 4, 4)]  # type: ignore[union-attr]
    again = TopicManager(str(tmp_path))
    assert again.all() == [TopicConfig("orders", 4, 4)]
    assert again.data_version == version
    assert journal(tmp_path).read_bytes() == good
    (aside,) = (tmp_path / "config").glob("topics.json.journal.torn-*")
    assert aside.read_bytes() == torn
    again.upsert(TopicConfig("audit", 1, 1))  # appends after the cut
    assert {t.topic for t in TopicManager(str(tmp_path)).all()} == {"orders", "audit"}


def test_a_last_record_with_a_bad_crc_is_a_torn_append_too(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path))
    topics.upsert(TopicConfig("orders", 4, 4))
    topics.upsert(TopicConfig("audit", 1, 1))
    data = bytearray(journal(tmp_path).read_bytes())
    data[-5] ^= 0x01  # inside the last record's JSON
    journal(tmp_path).write_bytes(bytes(data))
    assert [t.topic for t in TopicManager(str(tmp_path)).all()] == ["orders"]


def test_damage_before_the_last_record_is_refused_with_the_fix(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path))
    for name in ("a", "b", "c"):
        topics.upsert(TopicConfig(name, 1, 1))
    lines = journal(tmp_path).read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"b"', b'"x"')  # CRC no longer matches
    journal(tmp_path).write_bytes(b"\n".join(lines))
    with pytest.raises(StateFileError) as e:
        TopicManager(str(tmp_path))
    assert e.value.path.endswith("topics.json.journal")
    assert "line 2: CRC mismatch" in e.value.problem
    assert "repair-state" in e.value.fix
    with pytest.raises(StateFileError):
        load_topics(str(tmp_path))


def test_a_well_framed_record_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    record = {"seq": 1, "v": {"counter": 1}, "put": [{"topic": "orders", "perm": "rw"}]}
    (tmp_path / "config").mkdir()
    journal(tmp_path).write_bytes(state_journal.encode(record) + state_journal.encode({"seq": 2}))
    with pytest.raises(StateFileError, match=r"line 1: .*perm"):
        TopicManager(str(tmp_path))


def test_compaction_rewrites_the_snapshot_and_empties_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journaled_table, "COMPACT_MIN_ENTRIES", 10)
    topics = TopicManager(str(tmp_path))
    for i in range(25):
        topics.upsert(TopicConfig(f"t{i:02d}", 1, 1))
    snapshot = json.loads((tmp_path / "config" / "topics.json").read_text())
    assert snapshot["journal_seq"] == 22  # compacted after records 11 and 22
    assert len(snapshot["topics"]) == 22
    assert len(journal(tmp_path).read_bytes().splitlines()) == 3
    again = TopicManager(str(tmp_path))
    assert [t.topic for t in again.all()] == [f"t{i:02d}" for i in range(25)]
    assert again.data_version == topics.data_version


def test_a_crash_between_snapshot_and_truncation_replays_nothing_twice(tmp_path: Path) -> None:
    topics = TopicManager(str(tmp_path))
    topics.upsert(TopicConfig("orders", 4, 4))
    topics.delete("orders")
    old_journal = journal(tmp_path).read_bytes()
    topics.upsert(TopicConfig("orders", 8, 8))
    topics._table.compact()
    # The journal as it was before the compaction truncated it (records 1-2 are in the
    # snapshot, whose journal_seq is 3), as if the crash came in between.
    journal(tmp_path).write_bytes(old_journal)
    again = TopicManager(str(tmp_path))
    assert again.all() == [TopicConfig("orders", 8, 8)]
    assert again.data_version == topics.data_version


def test_groups_are_journaled_too(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(str(tmp_path))
    groups.observe("billing", 1, ["orders"], now_ms=10)
    groups.update("billing", fifo=True, now_ms=11)
    groups.observe("audit", 1, ["orders"], now_ms=12)
    groups.delete("audit")
    assert not (tmp_path / "config" / "subscriptionGroup.json").exists()
    assert (tmp_path / "config" / "subscriptionGroup.json.journal").exists()
    again = SubscriptionGroupManager(str(tmp_path))
    assert again.all() == groups.all()
    assert [g.group for g in again.all()] == ["billing"] and again.all()[0].settings.fifo
    assert again.data_version == groups.data_version
    stored = load_groups(str(tmp_path))
    assert stored is not None and stored.groups == groups.all()


CHILD = """
import sys
from tidemq.services.broker.topics import TopicConfig, TopicManager
topics = TopicManager(sys.argv[1])
for i in range(50):
    topics.upsert(TopicConfig(f"t{i}", 1, 1))
    print(i, flush=True)
sys.stdin.read()
"""


def test_acknowledged_changes_survive_kill_9(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        acked = [int(child.stdout.readline()) for _ in range(50)]
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert {t.topic for t in TopicManager(str(tmp_path)).all()} == {f"t{i}" for i in acked}
