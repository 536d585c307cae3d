"""The audit and replica comparison jobs on Spark, over segments the real store wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.segment_files import (
    FILE_SIZE,
    damaged_archive,
    flip_byte,
    segment_path,
    write_segments,
)
from tidemq.pipeline.jobs.audit import audit
from tidemq.pipeline.jobs.compare import compare

pytestmark = pytest.mark.spark


def test_audit_reports_records_topics_and_a_planted_corruption(
    spark: SparkSession, tmp_path: Path
) -> None:
    d = damaged_archive(tmp_path, 200, lambda _: 95)  # inside the body
    archive, appended, victim, damaged, at = d.archive, d.appended, d.victim, d.file, d.file_offset
    out = tmp_path / "audit"

    # Splits smaller than a file: tasks start mid-file and must find their first record.
    summary = audit(spark, [str(archive / "0*")], str(out), split_bytes=5000)

    assert summary["ok"] is False
    assert summary["corrupt"] == [
        {
            "file": str(damaged),
            "file_offset": at,
            "phy_offset": victim.phy_offset,
            "bytes": victim.size,
            "problem": "body CRC mismatch",
        }
    ]
    good = [a for a in appended if a is not victim]
    assert summary["records"] == len(good)
    for topic in ("orders", "audit-log"):
        mine = [a for a in good if a.topic == topic]
        t = summary["topics"][topic]
        assert (t["records"], t["bytes"], t["body_bytes"]) == (
            len(mine),
            sum(a.size for a in mine),
            sum(len(a.body) for a in mine),
        )
    assert json.loads((out / "summary.json").read_text()) == summary

    records = spark.read.parquet(str(out / "records")).collect()
    assert sorted((r.phy_offset, r.topic, r.queue, r.queue_offset, r.tags) for r in records) == [
        (a.phy_offset, a.topic, a.queue_id, a.queue_offset, a.tags) for a in good
    ]
    [corrupt] = spark.read.parquet(str(out / "corrupt")).collect()
    assert (corrupt.file, corrupt.phy_offset) == (str(damaged), victim.phy_offset)


def test_compare_finds_a_prefix_and_then_a_planted_divergence(
    spark: SparkSession, tmp_path: Path
) -> None:
    master, appended = write_segments(tmp_path / "master")
    # A slave that has replicated up to record 250: the same files, the last one cut there
    # and zero-filled, as a preallocated segment would be.
    slave = tmp_path / "slave"
    slave.mkdir()
    cut = appended[250].phy_offset
    for f in sorted(master.iterdir()):
        base = int(f.name)
        if base > cut:
            break
        data = f.read_bytes()[: cut - base] if base + FILE_SIZE > cut else f.read_bytes()
        (slave / f.name).write_bytes(data.ljust(FILE_SIZE, b"\0"))

    report = compare(spark, str(master), str(slave), split_bytes=4096)
    assert (report["slave_is_prefix"], report["first_divergence"]) == (True, None)
    assert report["slave_end_offset"] == cut

    victim = appended[120]
    path, at = segment_path(slave, victim.phy_offset)
    flip_byte(path, at + 22)  # its QUEUEOFFSET
    report = compare(spark, str(master), str(slave), split_bytes=4096)

    assert report["slave_is_prefix"] is False
    assert report["first_divergence"] == victim.phy_offset + 22
    assert report["master_record"]["phy_offset"] == victim.phy_offset
    assert report["master_record"]["queue_offset"] == victim.queue_offset
    assert report["master_record"]["problem"] is None
    assert report["slave_record"]["phy_offset"] == victim.phy_offset
    assert report["slave_record"]["problem"] == "record CRC mismatch"

    # The master's retention deleted its first file: that one cannot be compared.
    shutil.rmtree(master)
    master.mkdir()
    for f in sorted((tmp_path / "slave").iterdir())[1:]:
        shutil.copy(f, master / f.name)
    report = compare(spark, str(master), str(slave), split_bytes=4096)
    assert [n["file"] for n in report["not_compared"]] == [str(slave / f"{0:020d}")]
