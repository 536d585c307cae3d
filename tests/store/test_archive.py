"""Archive instead of delete (docs/archive.md), on a directory: a sealed file is archived and
verified before retention may delete it, reads past local retention come from the archive with
the same bytes and ids, an unreachable archive stops deletion, a corrupt object is never served,
and per-topic policies decide which files are archived."""

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import S3Archive
from tests.store.conftest import tiny_config
from tests.store.test_retention import age_files
from tidemq.storage import Message, MessageStore
from tidemq.storage.archive.backends import DirectoryBackend, open_backend
from tidemq.storage.archive.config import ArchiveConfig
from tidemq.storage.archive.format import (
    ArchiveCorruptError,
    ArchiveError,
    ArchiveUnavailableError,
    Codec,
    chunk_key,
    entry_key,
    scan_segment,
)
from tidemq.storage.archive.reader import ArchiveReader
from tidemq.storage.errors import OffsetBelowMinError
from tidemq.storage.retention import Held

pytestmark = pytest.mark.store

HOUR = 3600.0


def archived_store(root: Path, archive: Path, **over: Any) -> MessageStore:
    # An archive directory must exist (a mount point): a missing one is an unreachable archive.
    archive.mkdir(exist_ok=True)
    with_archive = over.pop("with_archive", True)
    arch = ArchiveConfig(
        over.pop("uri", str(archive)),
        s3_endpoint_url=over.pop("s3", ""),
        chunk_bytes=over.pop("chunk_bytes", 4096),
        cache_bytes=1 << 20,
        interval_ms=over.pop("interval_ms", 3_600_000),  # passes run by the test
        default_policy=over.pop("default_policy", "archive"),
        compression=over.pop("compression", "zstd"),
    )
    cfg = tiny_config(
        root,
        commitlog_file_size_bytes=16384,
        delete_when_hours=(time.localtime().tm_hour,),
        delete_file_batch_max=100,
        archive=arch if with_archive else None,
        **over,
    )
    return MessageStore(cfg, disk_usage_ratio=lambda: 0.1)


def fill(store: MessageStore, topic: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.put_messages([Message(topic, b"m%05d" % i + b"." * 300, keys=[f"k{i}"])])
    assert store.wait_dispatched(store.commitlog.max_offset, 10)


def read_all(store: MessageStore, topic: str, start: int) -> list[Any]:
    out = []
    q = start
    while q < store.max_offset(topic, 0):
        got = store.get_messages(topic, 0, q, max_count=7)
        assert got.next_offset > q
        out.extend(got.messages)
        q = got.next_offset
    return out


def test_expired_files_are_archived_then_deleted_and_read_back_the_same(tmp_path: Path) -> None:
    with archived_store(tmp_path / "s", tmp_path / "a") as s:
        fill(s, "t", 200)
        before = read_all(s, "t", 0)
        raw_before = s.get_records("t", 0, 0, max_count=200, max_bytes=1 << 30).records
        files = len(s.commitlog.mfq.files)
        age_files(tmp_path / "s", 73 * HOUR)
        # Nothing is archived yet: retention holds every file.
        assert s.run_retention() == 0
        assert s.retention_counts.held[Held.UNARCHIVED] == 1
        assert s.run_archive() == files - 1  # every sealed file
        assert s.run_retention() == files - 1
        assert s.commitlog.min_offset > 0
        assert s.min_offset("t", 0) == 0  # the archive still serves queue offset 0
        after = read_all(s, "t", 0)
        assert [m.msg_id for m in after] == [m.msg_id for m in before]
        assert [m.body for m in after] == [m.body for m in before]
        # Records as stored, from the archive (a file per call) then locally.
        raw, q = b"", 0
        while q < s.max_offset("t", 0):
            got = s.get_records("t", 0, q, max_count=200, max_bytes=1 << 30)
            raw, q = raw + got.records, got.next_offset
        assert raw == raw_before
        assert s.look_message(before[0].phy_offset).body == before[0].body
        assert s.get_message_by_id(before[3].msg_id).body == before[3].body
        first_ms = before[50].store_timestamp_ms
        assert s.offset_by_time("t", 0, first_ms) <= 50
    # After a restart the manifest is read from the archive again.
    with archived_store(tmp_path / "s", tmp_path / "a") as s:
        s.run_archive()
        again = read_all(s, "t", 0)
        assert [m.msg_id for m in again] == [m.msg_id for m in before]


def test_tag_filters_apply_to_archived_reads(tmp_path: Path) -> None:
    with archived_store(tmp_path / "s", tmp_path / "a") as s:
        for i in range(120):
            s.put_messages(
                [Message("t", b"%d" % i + b"." * 200, tags="even" if i % 2 == 0 else "odd")]
            )
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        s.run_archive()
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() > 0
        msgs: list[Any] = []
        q = 0
        while len(msgs) < 10:  # an archived read ends at its file's end
            got = s.get_messages("t", 0, q, max_count=10 - len(msgs), tags=["odd"])
            msgs, q = msgs + got.messages, got.next_offset
        assert all(m.tags == "odd" for m in msgs)
        assert [int(m.body.split(b".")[0]) for m in msgs] == list(range(1, 21, 2))


def test_an_unreachable_archive_stops_deletion_and_loses_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    with archived_store(tmp_path / "s", archive) as s:
        assert s.archiver is not None
        fill(s, "t", 150)
        archived = s.run_archive()
        fill(s, "t", 150, start=150)  # more sealed files, not archived yet
        shutil.move(archive, tmp_path / "unmounted")  # the volume goes away
        assert s.run_archive() == 0
        assert s.archiver.counts.failures == 1
        assert "directory missing" in s.archiver.counts.last_error
        assert s.archiver.counts.pending_files > 0
        age_files(tmp_path / "s", 73 * HOUR)
        # Only what was archived before the archive went away goes; the rest is held.
        assert s.run_retention() == archived
        assert s.retention_counts.held[Held.UNARCHIVED] == 1
        assert len(s.commitlog.mfq.files) > 1
        shutil.move(tmp_path / "unmounted", archive)  # back: the backlog is archived
        assert s.run_archive() > 0
        assert s.archiver.counts.pending_files == 0
        assert s.run_retention() > 0
        got = read_all(s, "t", 0)
        assert [int(m.body[1:6]) for m in got] == list(range(300))


def test_a_crash_mid_upload_resumes_without_resending_or_duplicating(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    with archived_store(tmp_path / "s", archive) as s:
        fill(s, "t", 60)
        first = s.commitlog.mfq.files[0]
        name = f"{first.base_offset:020d}"
    backend = DirectoryBackend(str(archive))
    # What a crash after two chunks leaves: two chunks, no entry.
    data = (tmp_path / "s" / "commitlog" / name).read_bytes()
    scan = scan_segment(data, 0, True, 4096)
    codec = Codec("zstd")
    for i in range(2):
        end = scan.cuts[i + 1]
        backend.put(chunk_key(name, i), codec.compress(data[scan.cuts[i] : end]))
    assert backend.get(entry_key(name)) is None
    with archived_store(tmp_path / "s", archive) as s:
        assert s.run_archive() == len(s.commitlog.mfq.files) - 1
        assert s.archiver is not None
        assert s.archiver.reader.has(name)
        assert s.archiver.counts.chunks_reused == 2
    entries = sorted(os.listdir(archive / "manifest"))
    assert entries.count(f"{name}.json") == 1


def test_a_corrupt_archived_object_is_detected_and_never_served(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    with archived_store(tmp_path / "s", archive) as s:
        fill(s, "t", 100)
        s.run_archive()
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() > 0
        victim = archive / "segments" / f"{0:020d}" / "chunk-000000"
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        victim.write_bytes(bytes(raw))
    with archived_store(tmp_path / "s", archive) as s:
        s.run_archive()
        with pytest.raises(ArchiveCorruptError, match="checksum"):
            s.get_messages("t", 0, 0)
        reader = ArchiveReader(DirectoryBackend(str(archive)), cache_bytes=1 << 20, record_crc=True)
        reader.refresh()
        assert reader.min_offset == 0


def test_topics_with_policy_delete_are_not_uploaded(tmp_path: Path) -> None:
    with archived_store(tmp_path / "s", tmp_path / "a", default_policy="delete") as s:
        s.set_archive_policy(
            enabled=lambda: True,
            topic_policy=lambda t: "archive" if t == "keep" else None,
            safe_offset=lambda: None,
        )
        fill(s, "scratch", 120)
        fill(s, "keep", 5)
        fill(s, "scratch", 120, start=120)
        n = s.run_archive()
        assert n == len(s.commitlog.mfq.files) - 1
        reader = s.archiver.reader if s.archiver else None
        assert reader is not None
        kinds = [e.archived for e in reader.entries()]
        assert True in kinds and False in kinds
        archived_topics = {t for e in reader.entries() if e.archived for t in e.queues}
        assert "keep" in archived_topics
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() == n
        assert [m.body[:6] for m in read_all(s, "keep", 0)] == [b"m%05d" % i for i in range(5)]
        with pytest.raises(OffsetBelowMinError):
            s.get_messages("scratch", 0, 0)


def test_a_slave_deletes_only_what_its_master_archived(tmp_path: Path) -> None:
    # A slave holds its master's CommitLog byte for byte and shares its archive; it does not
    # archive, its retention follows the manifest the master writes.
    with archived_store(tmp_path / "m", tmp_path / "a", with_archive=False) as master:
        fill(master, "t", 150)
    shutil.copytree(tmp_path / "m", tmp_path / "sl")
    with archived_store(tmp_path / "sl", tmp_path / "a") as slave:
        slave.set_archive_policy(
            enabled=lambda: False, topic_policy=lambda t: None, safe_offset=lambda: None
        )
        age_files(tmp_path / "sl", 73 * HOUR)
        assert slave.run_archive() == 0
        assert slave.run_retention() == 0  # its master archived nothing yet
        sealed = len(slave.commitlog.mfq.files) - 1
        with archived_store(tmp_path / "m", tmp_path / "a") as master:
            assert master.run_archive() == sealed
        slave.run_archive()  # reads the manifest
        assert slave.run_retention() == sealed
        assert [int(m.body[1:6]) for m in read_all(slave, "t", 0)] == list(range(150))


def test_an_s3_archive_serves_reads_past_retention(tmp_path: Path, s3_archive: S3Archive) -> None:
    with archived_store(
        tmp_path / "s", tmp_path / "unused", uri=s3_archive.uri, s3=s3_archive.endpoint_url
    ) as s:
        fill(s, "t", 200)
        before = read_all(s, "t", 0)
        s.run_archive()
        sealed = len(s.commitlog.mfq.files) - 1
        age_files(tmp_path / "s", 73 * HOUR)
        assert s.run_retention() == sealed
        after = read_all(s, "t", 0)
        assert [(m.msg_id, m.body) for m in after] == [(m.msg_id, m.body) for m in before]
        assert s.archiver is not None
        assert s.archiver.reader.backend.uri == s3_archive.uri + "/"


def test_a_directory_archive_writes_whole_objects_and_refuses_bad_keys(tmp_path: Path) -> None:
    b = DirectoryBackend(str(tmp_path / "a"))
    with pytest.raises(ArchiveUnavailableError, match="directory missing"):
        list(b.list("manifest/"))  # an unmounted volume is not an empty archive
    (tmp_path / "a").mkdir()
    b.put("segments/x/chunk-000001", b"one")
    b.put("segments/x/chunk-000000", b"zero")
    b.put("segments/x/chunk-000000", b"zero, again")  # replaced whole
    assert b.get("segments/x/chunk-000000") == b"zero, again"
    assert b.get_range("segments/x/chunk-000000", 6, 11) == b"again"
    assert b.get("segments/x/missing") is None and b.md5("segments/x/missing") is None
    assert list(b.list("segments/")) == ["segments/x/chunk-000000", "segments/x/chunk-000001"]
    assert not [p for p in (tmp_path / "a" / "segments" / "x").iterdir() if p.name[0] == "."]
    for bad in ("../escape", "a//b", "", "./x"):
        with pytest.raises(ArchiveError, match="bad archive key"):
            b.put(bad, b"")
    with pytest.raises(ArchiveError, match="s3://BUCKET"):
        open_backend("ftp://host/path")


def test_another_broker_groups_archive_is_refused(tmp_path: Path) -> None:
    with archived_store(tmp_path / "a-store", tmp_path / "a") as first:
        first.set_archive_policy(
            enabled=lambda: True, topic_policy=lambda t: None, safe_offset=lambda: None,
            owner="DefaultCluster/broker-a",
        )  # fmt: skip
        fill(first, "t", 100)
        assert first.run_archive() > 0
    with archived_store(tmp_path / "b-store", tmp_path / "a") as other:
        other.set_archive_policy(
            enabled=lambda: True, topic_policy=lambda t: None, safe_offset=lambda: None,
            owner="DefaultCluster/broker-b",
        )  # fmt: skip
        fill(other, "t", 100)
        assert other.run_archive() == 0
        assert other.archiver is not None
        assert (
            "belongs to broker group 'DefaultCluster/broker-a'" in other.archiver.counts.last_error
        )
        age_files(tmp_path / "b-store", 73 * HOUR)
        assert other.run_retention() == 0  # nothing of its own is archived: nothing goes
        assert other.archiver.reader.refused  # and reads below retention are refused
