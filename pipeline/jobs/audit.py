"""CommitLog audit: decode segments in parallel (copies of broker's files, or an archive's files
read directly), verify every CRC, and write

- ``OUT/records``: Parquet, one row per good record (topic, queue, offsets, timestamps, sizes,
  tags, keys, msg id, and the file and position it was found at);
- ``OUT/corrupt``: Parquet, one row per corrupt span (file, position, CommitLog offset, length,
  what was wrong);
- ``OUT/topics``: Parquet, per topic: records, bytes, queues, first and last store time;
- ``OUT/summary.json``: all of the above in one JSON document (also printed).

usage: spark-submit pipeline/jobs/audit.py [SEGMENTS...] [--archive URI]... --out DIR
          [--archive-s3-endpoint URL] [--split-mb 64]
Exit code 0 when every record checked out, 1 when damage was found. An archived object that
fails its checksums fails the job (naming the object): the archive's own checks say it is not
what was archived, and nothing of that file is read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidemq.pipeline.jobs import add_audit_arguments, check_audit_arguments, job_main
from tidemq.pipeline.jobs.archive import ArchiveLocation, locations
from tidemq.pipeline.jobs.segments import find_inputs
from tidemq.pipeline.session import get_session

ISO_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"  # with the session time zone's offset


def audit(
    spark: SparkSession,
    paths: Sequence[str],
    out_dir: str,
    split_bytes: int,
    archives: Sequence[ArchiveLocation] = (),
) -> dict[str, Any]:
    """Audit the segment files of ``paths`` and the archived files of ``archives``."""
    inputs = find_inputs(paths, archives)
    segments = inputs.segments
    reader = (
        spark.read.format("tidemq_segments")
        .option("paths", json.dumps(list(paths)))
        .option("splitBytes", str(split_bytes))
    )
    if archives:
        endpoints = {a.s3_endpoint for a in archives}
        if len(endpoints) > 1:
            raise ValueError(f"archives at different S3 endpoints {sorted(map(str, endpoints))}")
        reader = reader.option("archives", json.dumps([a.uri for a in archives]))
        if archives[0].s3_endpoint:
            reader = reader.option("archiveS3Endpoint", archives[0].s3_endpoint)
    scan: DataFrame = reader.load().persist(StorageLevel.MEMORY_AND_DISK)
    try:
        records = scan.where(F.col("problem").isNull()).drop("problem")
        records.write.mode("overwrite").parquet(os.path.join(out_dir, "records"))
        corrupt = scan.where(F.col("problem").isNotNull()).select(
            "file", "file_offset", "phy_offset", "size", "problem"
        )
        corrupt.write.mode("overwrite").parquet(os.path.join(out_dir, "corrupt"))
        topics = records.groupBy("topic").agg(
            F.count(F.lit(1)).alias("records"),
            F.sum("size").alias("bytes"),
            F.sum("body_size").alias("body_bytes"),
            F.countDistinct("queue").alias("queues"),
            F.min("store_timestamp").alias("first_store_timestamp"),
            F.max("store_timestamp").alias("last_store_timestamp"),
        )
        topics.write.mode("overwrite").parquet(os.path.join(out_dir, "topics"))
        topic_rows = sorted(
            topics.withColumn("first", F.date_format("first_store_timestamp", ISO_FORMAT))
            .withColumn("last", F.date_format("last_store_timestamp", ISO_FORMAT))
            .collect(),
            key=lambda r: r["topic"],
        )
        corrupt_rows = sorted(corrupt.collect(), key=lambda r: r["phy_offset"])
    finally:
        scan.unpersist()
    summary = {
        "files": len(segments),
        "file_bytes": sum(s.size_bytes for s in segments),
        "archives": {
            a.uri: {
                "files": len(a.segments),
                "file_bytes": sum(s.size_bytes for s in a.segments),
                # Recorded by the manifest as not archived (no topic in them wanted it):
                # nothing of them is in the archive to audit.
                "not_archived": a.not_archived,
            }
            for a in inputs.archives
        },
        "records": sum(r["records"] for r in topic_rows),
        "record_bytes": sum(r["bytes"] for r in topic_rows),
        "topics": {
            r["topic"]: {
                "records": r["records"],
                "bytes": r["bytes"],
                "body_bytes": r["body_bytes"],
                "queues": r["queues"],
                "first_store_timestamp": r["first"],
                "last_store_timestamp": r["last"],
            }
            for r in topic_rows
        },
        "corrupt": [
            {
                "file": r["file"],
                "file_offset": r["file_offset"],
                "phy_offset": r["phy_offset"],
                "bytes": r["size"],
                "problem": r["problem"],
            }
            for r in corrupt_rows
        ],
        "ok": not corrupt_rows,
        "out": os.path.abspath(out_dir),
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def run(args: argparse.Namespace, default_master: str | None = None) -> int:
    check_audit_arguments(args)
    spark = get_session("tidemq-audit", args.master or default_master)
    archives = locations(args.archive, args.archive_s3_endpoint)
    summary = audit(spark, args.segments, args.out, args.split_mb << 20, archives)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    return job_main(argv, __doc__ or "", add_audit_arguments, run)


if __name__ == "__main__":
    sys.exit(main())
