"""`tidemq archive list|verify|restore` as an operator runs it: a real process on a directory
archive and on an S3 one (moto on loopback), exit codes and output; a restored store opened
with MessageStore serves every archived message back (bodies, ids, queue offsets, keys)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.s3_server import S3Archive
from tests.store.test_archive import archived_store
from tests.store.test_cli import tidemq
from tidemq.storage import Message, MessageStore, StoreConfig
from tidemq.storage.archive.format import chunk_key

pytestmark = pytest.mark.store

FILE = 16384  # archived_store's CommitLog file size
QUEUES = {"orders": 3, "audit": 1}


def archive_cmd(
    command: str, archive: str, *args: str, s3: S3Archive | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--s3-endpoint", s3.endpoint_url] if s3 is not None else []
    return tidemq(
        "archive", command, "--archive", archive, *extra, *args, env=s3.env if s3 else None
    )


Fact = tuple[str, bytes, int, int, str | None, tuple[str, ...]]


def fact(m: Any) -> Fact:
    """What a reader sees of a message: id, body, queue offset, CommitLog offset, tag, keys."""
    return (m.msg_id, m.body, m.queue_offset, m.phy_offset, m.tags, tuple(m.keys))


@dataclass
class Source:
    """A broker's store that archived every sealed CommitLog file, and what it holds."""

    root: Path
    archive: str
    messages: dict[tuple[str, int], list[Fact]]
    archived_end: int  # the end of the last archived file

    def in_range(self, lo: int, hi: int) -> dict[tuple[str, int], list[Fact]]:
        return {k: [f for f in v if lo <= f[3] < hi] for k, v in self.messages.items()}


def make_source(root: Path, archive: Path | None = None, **over: Any) -> Source:
    with archived_store(root, archive or root.parent / "archive", **over) as s:
        i = 0
        for rnd in range(60):
            for topic, queues in QUEUES.items():
                for q in range(queues):
                    body = f"{topic}-{q}-{rnd:03d}".encode() + bytes(range(256))
                    s.put_messages(
                        [Message(topic, body, queue_id=q, tags=f"t{i % 3}", keys=[f"k{i}"])]
                    )
                    i += 1
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        archived = s.run_archive()
        assert archived == len(s.commitlog.mfq.files) - 1 >= 5
        messages = {
            (topic, q): [fact(m) for m in read_queue(s, topic, q)]
            for topic, queues in QUEUES.items()
            for q in range(queues)
        }
        end = s.commitlog.mfq.files[-1].base_offset
    uri = over.get("uri", str(archive or root.parent / "archive"))
    return Source(root, uri, messages, end)


def read_queue(store: MessageStore, topic: str, queue_id: int) -> list[Any]:
    out: list[Any] = []
    q = store.min_offset(topic, queue_id)
    while q < store.max_offset(topic, queue_id):
        got = store.get_messages(topic, queue_id, q, max_count=16)
        assert got.next_offset > q
        out.extend(got.messages)
        q = got.next_offset
    return out


def open_restored(root: Path) -> MessageStore:
    """The restored store as a broker opens it: the layout of its store.json."""
    layout = json.loads((root / "store.json").read_text())
    keys = ("commitlog_file_size_bytes", "consume_queue_entries_per_file", "index_slot_num")
    kwargs = {k: layout[k] for k in (*keys, "index_max_num", "record_crc")}
    return MessageStore(StoreConfig(str(root), **kwargs))


def assert_serves(root: Path, want: dict[tuple[str, int], list[Fact]]) -> None:
    """The restored store rebuilt its ConsumeQueues and index: every message of ``want`` reads
    back the same, by queue, by id and by key, and nothing else is there."""
    with open_restored(root) as s:
        assert s.recovery is not None and s.recovery.full_redispatch
        for (topic, q), facts in want.items():
            got = [fact(m) for m in read_queue(s, topic, q)]
            assert got == facts, (topic, q)
            if facts:
                assert s.min_offset(topic, q) == facts[0][2]
                msg_id, body, _, _, _, keys = facts[len(facts) // 2]
                assert s.get_message_by_id(msg_id).body == body
                assert [m.body for m in s.query_by_key(topic, keys[0])] == [body]


def entries(source: Source, s3: S3Archive | None = None) -> list[dict[str, Any]]:
    r = archive_cmd("list", source.archive, "--json", s3=s3)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_list_verify_and_restore_a_directory_archive(tmp_path: Path) -> None:
    source = make_source(tmp_path / "broker")
    listed = entries(source)
    names = [e["name"] for e in listed]
    assert names == [f"{n * FILE:020d}" for n in range(source.archived_end // FILE)]
    assert all(e["archived"] and e["records"] > 0 for e in listed)
    assert [e["end_offset"] for e in listed[:-1]] == [e["base_offset"] for e in listed[1:]]
    assert {e["topics"] for e in listed} == {2} and {e["queues"] for e in listed} == {4}
    assert sum(e["records"] for e in listed) == sum(
        len(v) for v in source.in_range(0, source.archived_end).values()
    )
    assert all(0 < e["stored_bytes"] < e["size_bytes"] for e in listed)  # zstd
    text = archive_cmd("list", source.archive)
    assert text.returncode == 0
    for e in listed:
        (row,) = [line for line in text.stdout.splitlines() if line.startswith(e["name"])]
        assert f"[{e['base_offset']}, {e['end_offset']})" in row and " archived " in row
        assert f"{e['size_bytes']} -> {e['stored_bytes']}" in row and "2 topic(s)" in row
    assert f"{len(listed)} file(s), {len(listed)} archived, 0 skipped" in text.stdout

    r = archive_cmd("verify", source.archive)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[:2] for line in r.stdout.splitlines()[:-1]] == [[n, "ok:"] for n in names]
    assert f"{len(names)} file(s) checked: {len(names)} ok" in r.stdout

    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    r = archive_cmd("restore", source.archive, "--to", str(target), "--layout-from", layout)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(target / "commitlog")) == names
    for name in names:  # byte for byte what the broker wrote
        assert (target / "commitlog" / name).read_bytes() == (
            source.root / "commitlog" / name
        ).read_bytes()
    assert json.loads((target / "store.json").read_text()) == json.loads(Path(layout).read_text())
    assert_serves(target, source.in_range(0, source.archived_end))

    # Again: every file is there and identical; nothing is written.
    r = archive_cmd("restore", source.archive, "--to", str(target), "--layout-from", layout)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("skipped: already in") == len(names)
    assert f"restored 0 file(s) ({len(names)} already there)" in r.stdout


def test_verify_names_a_corrupt_or_missing_chunk_and_restore_refuses_it(tmp_path: Path) -> None:
    source = make_source(tmp_path / "broker")
    archive = Path(source.archive)
    victim = f"{2 * FILE:020d}"
    chunk = archive / chunk_key(victim, 1)
    original = chunk.read_bytes()
    raw = bytearray(original)
    raw[len(raw) // 2] ^= 0x01
    chunk.write_bytes(bytes(raw))
    r = archive_cmd("verify", source.archive)
    assert r.returncode == 1
    bad = [line for line in r.stdout.splitlines() if "CORRUPT" in line]
    assert len(bad) == 1 and bad[0].startswith(f"{victim} CORRUPT:")
    assert chunk_key(victim, 1) in bad[0] and "checksum" in bad[0]
    assert "1 corrupt or missing" in r.stdout
    assert r.stderr.strip() == (
        f"tidemq: ARCHIVE_CORRUPT: archived CommitLog files corrupt or missing: {victim}"
    )
    # A range that leaves the damaged file out passes.
    r = archive_cmd("verify", source.archive, "--to-offset", str(2 * FILE))
    assert r.returncode == 0 and "2 file(s) checked: 2 ok" in r.stdout

    # Restore writes what checks, stops at the damaged file and says so.
    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    r = archive_cmd("restore", source.archive, "--to", str(target), "--layout-from", layout)
    assert r.returncode == 1
    assert f"ARCHIVE_CORRUPT: archived object {chunk_key(victim, 1)} fails" in r.stderr
    assert sorted(os.listdir(target / "commitlog")) == [f"{n * FILE:020d}" for n in range(2)]

    # A chunk gone is as bad, and named the same way.
    chunk.write_bytes(original)
    (archive / chunk_key(f"{FILE:020d}", 0)).unlink()
    r = archive_cmd("verify", source.archive)
    assert r.returncode == 1
    assert f"{FILE:020d} CORRUPT: archived object {chunk_key(f'{FILE:020d}', 0)} is missing" in (
        r.stdout
    )
    assert r.stderr.rstrip().endswith(f"corrupt or missing: {FILE:020d}")  # the other mended


def test_restore_refuses_to_overwrite_a_different_file(tmp_path: Path) -> None:
    source = make_source(tmp_path / "broker")
    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    first = f"{0:020d}"
    assert archive_cmd(
        "restore", source.archive, "--to", str(target), "--layout-from", layout,
        "--to-offset", str(2 * FILE),
    ).returncode == 0  # fmt: skip
    mine = bytearray((target / "commitlog" / first).read_bytes())
    mine[100] ^= 0xFF
    (target / "commitlog" / first).write_bytes(bytes(mine))
    r = archive_cmd("restore", source.archive, "--to", str(target))
    assert r.returncode == 1
    assert "RESTORE_REFUSED" in r.stderr and "refusing to overwrite" in r.stderr
    assert f"commitlog/{first} exists and differs" in r.stderr
    assert "Traceback" not in r.stderr
    assert (target / "commitlog" / first).read_bytes() == bytes(mine)
    assert sorted(os.listdir(target / "commitlog")) == [first, f"{FILE:020d}"]  # nothing more


def test_restore_from_past_zero_then_after_it_and_refuse_below_an_opened_store(
    tmp_path: Path,
) -> None:
    """The store's first CommitLog file starts past 0 and it has no checkpoint: opening it
    builds ConsumeQueues and index from the restored files, queue offsets as they were."""
    source = make_source(tmp_path / "broker")
    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    lo, mid = 2 * FILE, 4 * FILE
    r = archive_cmd(
        "restore", source.archive, "--to", str(target), "--layout-from", layout,
        "--from-offset", str(lo + 1), "--to-offset", str(mid),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(target / "commitlog")) == [f"{lo:020d}", f"{lo + FILE:020d}"]
    assert not (target / "checkpoint").exists()
    want = source.in_range(lo, mid)
    assert all(facts and facts[0][2] > 0 for facts in want.values())
    assert_serves(target, want)

    # The rest after it, into the store that has been opened: recovery dispatches them.
    r = archive_cmd("restore", source.archive, "--to", str(target), "--from-offset", str(mid))
    assert r.returncode == 0, r.stderr
    with open_restored(target) as s:
        for (topic, q), facts in source.in_range(lo, source.archived_end).items():
            assert [fact(m) for m in read_queue(s, topic, q)] == facts

    # Below it: the opened store would never index those files.
    r = archive_cmd("restore", source.archive, "--to", str(target))
    assert r.returncode == 1
    assert "RESTORE_REFUSED" in r.stderr and "has been opened" in r.stderr
    assert f"files below {lo} would not be indexed" in r.stderr
    assert sorted(os.listdir(target / "commitlog"))[0] == f"{lo:020d}"


def test_restore_in_pieces_before_the_store_is_first_opened(tmp_path: Path) -> None:
    """Files below and above what a never-opened store holds are added around it (below:
    newest first, so the files on disk stay contiguous at every step)."""
    source = make_source(tmp_path / "broker")
    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    r = archive_cmd(
        "restore", source.archive, "--to", str(target), "--layout-from", layout,
        "--from-offset", str(2 * FILE), "--to-offset", str(4 * FILE),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = archive_cmd("restore", source.archive, "--to", str(target))
    assert r.returncode == 0, r.stderr
    done = [line.split()[0] for line in r.stdout.splitlines() if " restored: " in line]
    names = [f"{n * FILE:020d}" for n in range(source.archived_end // FILE)]
    assert done == [names[1], names[0], *names[4:]]
    assert r.stdout.count("skipped: already in") == 2
    assert sorted(os.listdir(target / "commitlog")) == names
    assert_serves(target, source.in_range(0, source.archived_end))


def test_restore_refuses_gaps_and_layouts_that_cannot_hold_the_files(tmp_path: Path) -> None:
    source = make_source(tmp_path / "broker")
    layout = str(source.root / "store.json")
    target = tmp_path / "restored"
    assert archive_cmd(
        "restore", source.archive, "--to", str(target), "--layout-from", layout,
        "--to-offset", str(FILE),
    ).returncode == 0  # fmt: skip
    # Not adjacent to what the store holds: [16384, 32768) would be missing.
    r = archive_cmd("restore", source.archive, "--to", str(target), "--from-offset", str(2 * FILE))
    assert r.returncode == 1
    assert "would leave [16384, 32768) missing" in r.stderr
    # A store created with another file size cannot take the archive's files.
    other = tmp_path / "other"
    other.mkdir()
    small = {**json.loads(Path(layout).read_text()), "commitlog_file_size_bytes": 8192}
    (other / "store.json").write_text(json.dumps(small))
    r = archive_cmd("restore", source.archive, "--to", str(other))
    assert r.returncode == 1
    assert "commitlog_file_size_bytes 8192, the archived files are 16384 bytes" in r.stderr
    assert not (other / "commitlog").exists()
    # A store in use (a broker running on it) is never written under.
    with open_restored(target):
        r = archive_cmd("restore", source.archive, "--to", str(target))
    assert r.returncode == 2
    assert r.stderr.startswith(f"tidemq: STORE_LOCKED: store {target} is in use by another")
    # Without --layout-from, store.json gets the archive's file size and the store's defaults.
    fresh = tmp_path / "fresh"
    r = archive_cmd("restore", source.archive, "--to", str(fresh), "--to-offset", "1")
    assert r.returncode == 0, r.stderr
    defaults = StoreConfig(str(fresh))
    assert json.loads((fresh / "store.json").read_text()) == {
        "format_version": 1,
        "commitlog_file_size_bytes": FILE,
        "consume_queue_entries_per_file": defaults.consume_queue_entries_per_file,
        "index_slot_num": defaults.index_slot_num,
        "index_max_num": defaults.index_max_num,
        "record_crc": True,
    }


def test_files_no_topic_archived_are_listed_skipped_and_never_restored(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with archived_store(tmp_path / "broker", archive, default_policy="delete") as s:
        s.set_archive_policy(
            enabled=lambda: True,
            topic_policy=lambda t: "archive" if t == "keep" else None,
            safe_offset=lambda: None,
        )
        for i in range(200):
            topic = "keep" if 90 <= i < 95 else "scratch"
            s.put_messages([Message(topic, b"%05d" % i + b"." * 300, keys=[f"k{i}"])])
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        s.run_archive()
        keep = [fact(m) for m in read_queue(s, "keep", 0)]
    r = archive_cmd("list", str(archive), "--json")
    listed = [json.loads(line) for line in r.stdout.splitlines()]
    kinds = [e["archived"] for e in listed]
    assert kinds[0] is False and kinds[-1] is False and True in kinds
    text = archive_cmd("list", str(archive)).stdout
    assert text.count(" skipped ") == kinds.count(False)
    r = archive_cmd("verify", str(archive))
    assert r.returncode == 0
    assert r.stdout.count("skipped: no topic in it is archived") == kinds.count(False)

    # Asked for from offset 0: that file was never archived.
    r = archive_cmd("restore", str(archive), "--to", str(tmp_path / "r0"), "--from-offset", "0")
    assert r.returncode == 1
    assert f"file {0:020d} (CommitLog [0, {FILE})) was not archived" in r.stderr
    # Without bounds: the archived run between them.
    target = tmp_path / "restored"
    layout = str(tmp_path / "broker" / "store.json")
    r = archive_cmd("restore", str(archive), "--to", str(target), "--layout-from", layout)
    assert r.returncode == 0, r.stderr
    archived = [e["name"] for e in listed if e["archived"]]
    assert sorted(os.listdir(target / "commitlog")) == archived
    with open_restored(target) as restored:
        assert [fact(m) for m in read_queue(restored, "keep", 0)] == keep


def test_an_unreachable_archive_is_one_line_and_exit_2(tmp_path: Path, s3_endpoint: str) -> None:
    for command in ("list", "verify"):
        r = archive_cmd(command, str(tmp_path / "not-mounted"))
        assert r.returncode == 2
        assert r.stderr == (
            f"tidemq: ARCHIVE_UNAVAILABLE: archive file://{tmp_path}/not-mounted: "
            "directory missing\n"
        )
    s3 = S3Archive(s3_endpoint, "no-such-bucket", "x")
    r = archive_cmd("verify", s3.uri, s3=s3)
    assert r.returncode == 2
    assert r.stderr.startswith("tidemq: ARCHIVE_UNAVAILABLE: archive s3://no-such-bucket/x/")
    assert "NoSuchBucket" in r.stderr and "Traceback" not in r.stderr
    r = archive_cmd("list", "ftp://host/x")
    assert r.returncode == 2 and "use a path, file:///PATH or s3://BUCKET/PREFIX" in r.stderr


def test_an_s3_archive_lists_verifies_and_restores(tmp_path: Path, s3_archive: S3Archive) -> None:
    source = make_source(tmp_path / "broker", uri=s3_archive.uri, s3=s3_archive.endpoint_url)
    listed = entries(source, s3_archive)
    names = [e["name"] for e in listed]
    assert names == [f"{n * FILE:020d}" for n in range(source.archived_end // FILE)]
    r = archive_cmd("verify", source.archive, s3=s3_archive)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(names)} file(s) checked: {len(names)} ok" in r.stdout

    target = tmp_path / "restored"
    layout = str(source.root / "store.json")
    # The endpoint from AWS_ENDPOINT_URL this time (as a broker's environment gives it).
    r = tidemq(
        "archive", "restore", "--archive", source.archive, "--to", str(target),
        "--layout-from", layout, env=s3_archive.env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(target / "commitlog")) == names
    assert_serves(target, source.in_range(0, source.archived_end))

    # One byte of one chunk changed in the bucket: verify names the file.
    client = boto3.client("s3", endpoint_url=s3_archive.endpoint_url, region_name="us-east-1")
    key = f"{s3_archive.prefix}/{chunk_key(names[1], 0)}"
    raw = bytearray(client.get_object(Bucket=s3_archive.bucket, Key=key)["Body"].read())
    raw[-1] ^= 0x01
    client.put_object(Bucket=s3_archive.bucket, Key=key, Body=bytes(raw))
    r = archive_cmd("verify", source.archive, s3=s3_archive)
    assert r.returncode == 1
    assert f"{names[1]} CORRUPT: archived object {chunk_key(names[1], 0)} fails" in r.stdout
    assert r.stderr.rstrip().endswith(f"corrupt or missing: {names[1]}")
