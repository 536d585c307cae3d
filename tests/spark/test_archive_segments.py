"""The segment source and the audit and compare jobs over an archive (docs/archive.md), read
directly from a directory and from an S3 bucket (moto's server), without a broker: checked
against the records the store wrote (bodies, msg ids, offsets), and a corrupt archived object
fails the job, naming it, before any record of its file is read."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from tests.s3_server import S3_ENV, S3Archive
from tests.segment_files import flip_byte
from tests.store.test_archive import archived_store
from tests.store.test_retention import age_files
from tidemq.cli import main
from tidemq.pipeline import register
from tidemq.pipeline.jobs.archive import ArchiveInputError, ArchiveLocation
from tidemq.pipeline.jobs.audit import audit
from tidemq.pipeline.jobs.compare import compare
from tidemq.pipeline.jobs.segment_source import SegmentDataSource
from tidemq.pipeline.jobs.segments import find_segments, scan_split, splits
from tidemq.storage import Message, PutStatus

pytestmark = pytest.mark.spark

FILE_SIZE = 16384  # archived_store's CommitLog files
HOUR = 3600.0


@dataclass(frozen=True)
class Written:
    phy_offset: int
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes


@dataclass(frozen=True)
class Archived:
    written: list[Written]  # everything, in CommitLog order
    archived: list[Written]  # what lies in archived files
    kept: list[Written]  # what is left to read: in archived files, or in the local last file
    sealed: list[int]  # base offsets of the archived files
    not_archived: list[int]  # base offsets of the sealed files no topic in wanted archived
    commitlog: Path  # the store's directory: after retention, only the unsealed last file
    slave: Path  # a copy of every CommitLog file taken before retention (a replica)


def write_and_archive(
    root: Path, archive: Path, messages: int = 200, scratch: int = 0, **over: str
) -> Archived:
    """Messages on two topics (bodies of varied length) through a store that archives, with
    ``scratch`` messages of a topic whose policy is ``delete`` between their two halves (files
    holding only those are recorded as not archived); every sealed file goes to the archive,
    then retention deletes the local copies."""
    plan: list[tuple[str, int, bytes]] = []
    for i in range(messages):
        topic, queues = (("orders", 3), ("audit-log", 2))[i % 2]
        plan.append((topic, i // 2 % queues, b"body-%04d-" % i + b"x" * (i * 37 % 500)))
    half = messages // 2
    plan[half:half] = [("scratch", 0, b"scratch-%04d" % i + b"." * 300) for i in range(scratch)]
    written: list[Written] = []
    with archived_store(root / "store", archive, **over) as s:
        s.set_archive_policy(
            enabled=lambda: True,
            topic_policy=lambda t: "delete" if t == "scratch" else None,
            safe_offset=lambda: None,
        )
        for topic, queue_id, body in plan:
            put = s.put_messages([Message(topic, body, queue_id=queue_id)])
            assert put.wait(30) is PutStatus.PUT_OK
            [a] = put.results
            written.append(Written(a.phy_offset, topic, queue_id, a.queue_offset, a.msg_id, body))
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        bases = [f.base_offset for f in s.commitlog.mfq.files]
        slave = shutil.copytree(root / "store" / "commitlog", root / "slave")
        assert s.run_archive() == len(bases) - 1
        age_files(root / "store", 73 * HOUR)
        assert s.run_retention() == len(bases) - 1
    commitlog = root / "store" / "commitlog"
    assert sorted(p.name for p in commitlog.iterdir()) == [f"{bases[-1]:020d}"]
    topics: dict[int, set[str]] = {}
    for w in written:
        topics.setdefault(w.phy_offset - w.phy_offset % FILE_SIZE, set()).add(w.topic)
    skipped = [b for b in bases[:-1] if topics[b] == {"scratch"}]
    sealed = [b for b in bases[:-1] if b not in skipped]
    assert len(sealed) >= 3  # several archived files, one partition each
    assert bool(skipped) == bool(scratch)
    archived = [w for w in written if w.phy_offset - w.phy_offset % FILE_SIZE in sealed]
    kept = [w for w in written if w in archived or w.phy_offset >= bases[-1]]
    assert 0 < len(archived) < len(kept)
    return Archived(written, archived, kept, sealed, skipped, commitlog, slave)


def read_archive(
    spark: SparkSession, uri: str, endpoint: str | None = None, **options: str
) -> DataFrame:
    reader = spark.read.format("tidemq_segments").option("archive", uri)
    if endpoint is not None:
        reader = reader.option("archiveS3Endpoint", endpoint)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def check_source_rows(df: DataFrame, expected: list[Written], files: set[str]) -> None:
    rows = df.collect()
    assert all(r.problem is None for r in rows)
    got = sorted((r.phy_offset, r.topic, r.queue, r.queue_offset, r.msg_id, r.body) for r in rows)
    assert got == [
        (w.phy_offset, w.topic, w.queue_id, w.queue_offset, w.msg_id, w.body) for w in expected
    ]
    assert {r.file for r in rows} == files


def check_audit(summary: dict[str, Any], out: Path, spark: SparkSession, a: Archived) -> None:
    assert summary["ok"] is True
    assert summary["corrupt"] == []
    assert summary["records"] == len(a.kept)
    assert summary["files"] == len(a.sealed) + 1
    assert summary["topics"]["orders"]["queues"] == 3
    assert summary["topics"]["audit-log"]["queues"] == 2
    records = spark.read.parquet(str(out / "records")).collect()
    assert sorted((r.phy_offset, r.topic, r.queue, r.queue_offset, r.msg_id) for r in records) == [
        (w.phy_offset, w.topic, w.queue_id, w.queue_offset, w.msg_id) for w in a.kept
    ]


def test_segment_source_and_audit_read_a_directory_archive(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pipeline", "audit", "--out", str(tmp_path / "none")]) == 2
    assert "an archive (--archive URI)" in capsys.readouterr().err

    archive = tmp_path / "archive"
    a = write_and_archive(tmp_path, archive, scratch=120)
    names = [f"{b:020d}" for b in a.sealed]

    df = read_archive(spark, str(archive), includeBody="true")
    assert df.rdd.getNumPartitions() == len(a.sealed)  # one per archived file
    check_source_rows(df, a.archived, {f"file://{archive}/segments/{n}" for n in names})
    # The same archive as a file:// URI; without includeBody there is no body column.
    plain = read_archive(spark, f"file://{archive}")
    assert "body" not in plain.columns
    assert plain.count() == len(a.archived)

    # The whole log: the archive, and the broker's directory for what is not archived yet.
    out = tmp_path / "audit"
    summary = audit(spark, [str(a.commitlog)], str(out), 5000, [ArchiveLocation(str(archive))])
    check_audit(summary, out, spark, a)
    assert summary["archives"] == {
        f"file://{archive}": {
            "files": len(a.sealed),
            "file_bytes": len(a.sealed) * FILE_SIZE,
            "not_archived": [f"{b:020d}" for b in a.not_archived],
        }
    }


def test_a_corrupt_archived_chunk_fails_the_job_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    a = write_and_archive(tmp_path, archive)
    name = f"{a.sealed[1]:020d}"
    key = f"segments/{name}/chunk-000001"
    flip_byte(archive / key, (archive / key).stat().st_size // 2)
    location = ArchiveLocation(str(archive))

    with pytest.raises(PySparkException) as failed:
        read_archive(spark, str(archive)).collect()
    assert f"archived object {key} fails its checksum (MD5)" in str(failed.value)
    with pytest.raises(PySparkException, match=f"archived object {key} fails its checksum"):
        audit(spark, [str(a.commitlog)], str(tmp_path / "audit"), 5000, [location])

    # A task gets the error before any record of the file: none of it is ever yielded, not
    # even from the chunk before the damaged one. The files around it read as before.
    by_name = {
        s.segment.path.rsplit("/", 1)[1]: s for s in splits(find_segments([], [location]), 1)
    }
    assert len(by_name) == len(a.sealed)
    rows = scan_split(by_name[name])
    with pytest.raises(ArchiveInputError, match=f"archive file://{archive}: archived object {key}"):
        next(rows)
    good = [r for n, s in by_name.items() if n != name for r in scan_split(s)]
    damaged_file = range(a.sealed[1], a.sealed[1] + FILE_SIZE)
    assert sorted(r.phy_offset for r in good) == [
        w.phy_offset for w in a.archived if w.phy_offset not in damaged_file
    ]


def test_compare_a_replica_with_its_masters_archive(spark: SparkSession, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    a = write_and_archive(tmp_path, archive, scratch=120)
    last = a.slave / next(a.commitlog.iterdir()).name
    skipped = [
        {
            "file": str(a.slave / f"{b:020d}"),
            "reason": "the master's archive records this segment as not archived",
        }
        for b in a.not_archived
    ]

    # The master's directory holds its last file only; its archive, the rest.
    report = compare(spark, str(a.commitlog), str(a.slave), 4096, master_archive=str(archive))
    assert (report["slave_is_prefix"], report["first_divergence"]) == (True, None)
    assert report["not_compared"] == skipped
    assert report["master_files"] == len(a.sealed) + 1
    assert report["slave_files"] == len(a.sealed) + len(a.not_archived) + 1
    # The archive alone: the slave's last file is not sealed, so not archived yet.
    report = compare(spark, str(archive), str(a.slave), 4096)
    assert (report["slave_is_prefix"], report["master"]) == (True, f"file://{archive}")
    assert report["not_compared"] == [
        *skipped,
        {"file": str(last), "reason": "not archived yet (an archive holds sealed segments only)"},
    ]

    victim = a.written[5]  # in the first file, compared with its archived copy
    flip_byte(a.slave / f"{0:020d}", victim.phy_offset + 100)  # inside the body
    report = compare(spark, str(a.commitlog), str(a.slave), 4096, master_archive=str(archive))
    assert report["first_divergence"] == victim.phy_offset + 100
    assert report["master_record"]["msg_id"] == victim.msg_id
    assert report["master_record"]["problem"] is None
    assert report["slave_record"]["problem"] == "body CRC mismatch"


@pytest.fixture
def s3_spark(spark: SparkSession, s3_archive: S3Archive) -> Iterator[SparkSession]:
    """Spark's Python workers take their environment from the JVM's, fixed when the session
    started (perhaps before the S3 server's credentials were set in this process), plus the
    SparkContext's ``environment`` (``spark.executorEnv.*``) as it was when a data source was
    registered. The credentials go to the workers that way; the endpoint does not, so the
    ``archiveS3Endpoint`` option is what reaches the server."""
    env = spark.sparkContext.environment
    saved = {k: env.get(k) for k in S3_ENV}
    env.update(S3_ENV)
    register(spark)
    yield spark
    for k, v in saved.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    register(spark)


def test_segment_source_and_audit_read_an_s3_archive(
    s3_spark: SparkSession, s3_archive: S3Archive, tmp_path: Path
) -> None:
    spark, s3 = s3_spark, s3_archive
    a = write_and_archive(tmp_path, tmp_path / "unused", uri=s3.uri, s3=s3.endpoint_url)
    uri = f"s3://{s3.bucket}/{s3.prefix}/"  # how the backend names the archive
    names = [f"{b:020d}" for b in a.sealed]

    df = read_archive(spark, s3.uri, s3.endpoint_url, includeBody="true")
    assert df.rdd.getNumPartitions() == len(a.sealed)
    check_source_rows(df, a.archived, {f"{uri.rstrip('/')}/segments/{n}" for n in names})

    # The CLI: the broker's directory, and its archive in the bucket.
    out = tmp_path / "audit"
    argv = ["pipeline", "audit", str(a.commitlog), "--archive", s3.uri, "--out", str(out)]
    assert main([*argv, "--archive-s3-endpoint", s3.endpoint_url]) == 0
    summary = json.loads((out / "summary.json").read_text())
    check_audit(summary, out, spark, a)
    assert list(summary["archives"]) == [uri]

    # An object replaced by other bytes (MD5 and all, as far as S3 is concerned).
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1")
    key = f"{s3.prefix}/segments/{names[0]}/chunk-000000"
    raw = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    raw[len(raw) // 2] ^= 0xFF
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(raw))
    with pytest.raises(PySparkException) as failed:
        read_archive(spark, s3.uri, s3.endpoint_url).collect()
    message = str(failed.value)
    assert f"archive {uri}: archived object segments/{names[0]}/chunk-000000 fails" in message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r'needs "path" \(or load\(path\)\), "paths", "archive" or "archives"'),
        ({"archiveS3Endpoint": "http://127.0.0.1:1"}, 'no "archive" is'),
        ({"archive": "/a", "includeBody": "yes"}, '"includeBody" must be true or false'),
        ({"archive": "/a", "archiveEndpoint": "x"}, r"unknown option\(s\) \['archiveendpoint'\]"),
        ({"archives": "[oops"}, '"archives" is not a JSON list'),
        ({"archive": "ftp://host/x"}, "use a path, file:///PATH or s3://BUCKET/PREFIX"),
    ],
)
def test_bad_segment_source_options_are_refused_naming_them(
    options: dict[str, str], message: str
) -> None:
    def plan() -> None:
        source = SegmentDataSource(options)
        source.reader(source.schema()).partitions()

    with pytest.raises(ValueError, match=message):
        plan()
