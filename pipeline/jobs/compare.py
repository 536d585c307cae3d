"""Replica comparison: is the slave's CommitLog a byte-identical prefix of the master's?

Each segment file of the slave is compared with the master's file of the same base offset, in
splits run as Spark tasks; the slave's last file only up to the end of its records (its
preallocated tail is zeros where the master may already hold more). The report names the first
CommitLog offset where the two differ and decodes the master's and the slave's record there.
Segments the master no longer has (its retention deleted them) are listed as not compared.

usage: spark-submit pipeline/jobs/compare.py MASTER_DIR SLAVE_DIR [--out report.json]
Exit code 0 when the slave is a prefix, 1 when it diverges.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import SparkSession

from tidemq.pipeline.jobs import add_compare_arguments, job_main
from tidemq.pipeline.jobs.segments import SEGMENT_NAME, Segment, data_end, record_at, segment_of
from tidemq.pipeline.session import get_session

READ_BYTES: Final = 8 << 20


@dataclass(frozen=True)
class Chunk:
    """Positions [start, end) of the slave's file ``slave`` and the master's ``master``."""

    master: Segment
    slave: Segment
    start: int
    end: int


def _first_mismatch(a: bytes, b: bytes) -> int | None:
    if a == b:
        return None
    n = min(len(a), len(b))
    lo, hi = 0, n
    # Halve the range that differs while it is long; equal-length prefixes compare in C.
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return n  # one is a prefix of the other


def first_difference(chunk: Chunk) -> int | None:
    """The first CommitLog offset in the chunk where the two files differ."""
    with open(chunk.master.path, "rb") as fm, open(chunk.slave.path, "rb") as fs:
        pos = chunk.start
        fm.seek(pos)
        fs.seek(pos)
        while pos < chunk.end:
            n = min(READ_BYTES, chunk.end - pos)
            at = _first_mismatch(fm.read(n), fs.read(n))
            if at is not None:
                return chunk.slave.base_offset + pos + at
            pos += n
    return None


def _segments(directory: str) -> list[Segment]:
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory}: not a directory")
    names = sorted(n for n in os.listdir(directory) if SEGMENT_NAME.match(n))
    return [segment_of(os.path.join(directory, n)) for n in names]


def _record_json(seg: Segment, phy_offset: int) -> dict[str, Any] | None:
    rec = record_at(seg, phy_offset - seg.base_offset)
    return None if rec is None else {**dataclasses.asdict(rec), "keys": list(rec.keys)}


def compare(
    spark: SparkSession, master_dir: str, slave_dir: str, split_bytes: int
) -> dict[str, Any]:
    masters = {s.base_offset: s for s in _segments(master_dir)}
    slaves = _segments(slave_dir)
    sc = spark.sparkContext
    report: dict[str, Any] = {
        "master": os.path.abspath(master_dir),
        "slave": os.path.abspath(slave_dir),
        "slave_files": len(slaves),
        "master_files": len(masters),
        "not_compared": [],
    }
    if not slaves:
        report.update(slave_is_prefix=True, compared_bytes=0, first_divergence=None)
        return report
    last = slaves[-1]
    last_end = sc.parallelize([last], 1).map(data_end).collect()[0]
    report["slave_end_offset"] = last.base_offset + last_end
    first_master = min(masters) if masters else None
    chunks: list[Chunk] = []
    missing: list[int] = []
    compared = 0
    for seg in slaves:
        length = last_end if seg is last else seg.size_bytes
        master = masters.get(seg.base_offset)
        if master is None:
            if first_master is not None and seg.base_offset < first_master:
                report["not_compared"].append(
                    {"file": seg.path, "reason": "the master no longer has this segment"}
                )
            elif length > 0:
                missing.append(seg.base_offset)  # the master never had or lost these bytes
            continue
        compared += length
        chunks += [
            Chunk(master, seg, start, min(start + split_bytes, length))
            for start in range(0, length, split_bytes)
        ]
    found = missing + [
        d
        for d in sc.parallelize(chunks, max(1, len(chunks))).map(first_difference).collect()
        if d is not None
    ]
    divergence = min(found) if found else None
    report.update(compared_bytes=compared, first_divergence=divergence)
    report["slave_is_prefix"] = divergence is None
    if divergence is not None:
        slave_seg = max(s for s in slaves if s.base_offset <= divergence)
        master_seg = masters.get(slave_seg.base_offset)
        pairs = [("slave_record", slave_seg)] + (
            [("master_record", master_seg)] if master_seg is not None else []
        )
        decoded = (
            sc.parallelize(pairs, len(pairs))
            .map(lambda p: (p[0], _record_json(p[1], divergence)))
            .collect()
        )
        report.update({"master_record": None, **dict(decoded)})
    return report


def run(args: argparse.Namespace, default_master: str | None = None) -> int:
    spark = get_session("tidemq-compare", args.master or default_master)
    report = compare(spark, args.master_dir, args.slave_dir, args.split_mb << 20)
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if report["slave_is_prefix"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    return job_main(argv, __doc__ or "", add_compare_arguments, run)


if __name__ == "__main__":
    sys.exit(main())
