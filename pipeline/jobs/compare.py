"""Replica comparison: is the slave's CommitLog a byte-identical prefix of the master's?

Each segment file of the slave is compared with the master's file of the same base offset, in
splits run as Spark tasks; the slave's last file only up to the end of its records (its
preallocated tail is zeros where the master may already hold more). The report names the first
CommitLog offset where the two differ and decodes the master's and the slave's record there.
Segments the master no longer has (its retention deleted them) are listed as not compared.

Either side may be an archive (docs/archive.md) instead of a directory, and the master's
directory may be completed by its archive (``--master-archive``): segments its retention
deleted once archived are then compared with their archived copies, fetched and checked (MD5s,
SHA-256) by the task that compares them, one task per archived file. An archive holds sealed
files only: the slave's segments past the last archived one are listed as not archived yet when
the master is an archive alone, and those its manifest records as not archived (no topic in
them wanted archiving) as such.

usage: spark-submit pipeline/jobs/compare.py MASTER SLAVE [--master-archive URI]
          [--archive-s3-endpoint URL] [--out report.json]
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
from tidemq.pipeline.jobs.archive import ArchiveLocation, is_archive_uri
from tidemq.pipeline.jobs.segments import (
    SEGMENT_NAME,
    Segment,
    archived_segments,
    contents,
    data_end,
    record_at,
    segment_of,
)
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
    with contents(chunk.master) as master, contents(chunk.slave) as slave:
        pos = chunk.start
        while pos < chunk.end:
            n = min(READ_BYTES, chunk.end - pos)
            at = _first_mismatch(master[pos : pos + n], slave[pos : pos + n])
            if at is not None:
                return chunk.slave.base_offset + pos + at
            pos += n
    return None


def _segments(directory: str) -> list[Segment]:
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory}: not a directory")
    names = sorted(n for n in os.listdir(directory) if SEGMENT_NAME.match(n))
    return [segment_of(os.path.join(directory, n)) for n in names]


def is_archive(location: str) -> bool:
    """An archive URI, or a directory holding an archive (its ``manifest/``: a CommitLog
    directory never has one)."""
    return is_archive_uri(location) or os.path.isdir(os.path.join(location, "manifest"))


@dataclass(frozen=True)
class Side:
    """The files of one side, one per base offset (a local copy preferred to an archived one)."""

    name: str  # a directory's absolute path, or an archive's URI
    segments: list[Segment]  # by base offset
    archive_only: bool  # an archive and no directory: it holds sealed files only
    not_archived: frozenset[int]  # base offsets its archive records as not archived


def load_side(location: str, archive: str | None, s3_endpoint: str | None) -> Side:
    files: dict[int, Segment] = {}
    not_archived: set[int] = set()
    archive_only = is_archive(location)
    if archive_only:
        listed = archived_segments(ArchiveLocation(location, s3_endpoint))
        name = listed.uri
        files.update((s.base_offset, s) for s in listed.segments)
        not_archived.update(int(n) for n in listed.not_archived)
    else:
        name = os.path.abspath(location)
        files.update((s.base_offset, s) for s in _segments(location))
    if archive is not None:
        extra = archived_segments(ArchiveLocation(archive, s3_endpoint))
        for seg in extra.segments:
            files.setdefault(seg.base_offset, seg)
        not_archived.update(int(n) for n in extra.not_archived)
    return Side(name, sorted(files.values()), archive_only, frozenset(not_archived - set(files)))


def _record_json(seg: Segment, phy_offset: int) -> dict[str, Any] | None:
    rec = record_at(seg, phy_offset - seg.base_offset)
    if rec is None:
        return None
    fields = dataclasses.asdict(rec)
    del fields["body"]
    return {**fields, "keys": list(rec.keys)}


def compare(
    spark: SparkSession,
    master_dir: str,
    slave_dir: str,
    split_bytes: int,
    *,
    master_archive: str | None = None,
    s3_endpoint: str | None = None,
) -> dict[str, Any]:
    """``master_dir`` and ``slave_dir``: directories or archives (``is_archive``);
    ``master_archive``: the master's archive as well (see the module docstring)."""
    master = load_side(master_dir, master_archive, s3_endpoint)
    slave = load_side(slave_dir, None, s3_endpoint)
    masters = {s.base_offset: s for s in master.segments}
    slaves = slave.segments
    sc = spark.sparkContext
    report: dict[str, Any] = {
        "master": master.name,
        "slave": slave.name,
        "slave_files": len(slaves),
        "master_files": len(masters),
        "not_compared": [],
    }
    if master_archive is not None:
        report["master_archive"] = master_archive
    if not slaves:
        report.update(slave_is_prefix=True, compared_bytes=0, first_divergence=None)
        return report
    last = slaves[-1]
    last_end = sc.parallelize([last], 1).map(data_end).collect()[0]
    report["slave_end_offset"] = last.base_offset + last_end
    first_master = min(masters) if masters else None
    last_master = max(masters) if masters else None
    chunks: list[Chunk] = []
    missing: list[int] = []
    compared = 0
    for seg in slaves:
        length = last_end if seg is last else seg.size_bytes
        theirs = masters.get(seg.base_offset)
        if theirs is None:
            reason = None
            if seg.base_offset in master.not_archived:
                reason = "the master's archive records this segment as not archived"
            elif first_master is not None and seg.base_offset < first_master:
                reason = "the master no longer has this segment"
            elif master.archive_only and (last_master is None or seg.base_offset > last_master):
                reason = "not archived yet (an archive holds sealed segments only)"
            if reason is not None:
                report["not_compared"].append({"file": seg.path, "reason": reason})
            elif length > 0:
                missing.append(seg.base_offset)  # the master never had or lost these bytes
            continue
        compared += length
        # A task fetches an archived file whole: one task per file then, not per split.
        step = split_bytes if theirs.archived is None and seg.archived is None else max(length, 1)
        chunks += [
            Chunk(theirs, seg, start, min(start + step, length)) for start in range(0, length, step)
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
    report = compare(
        spark,
        args.master_dir,
        args.slave_dir,
        args.split_mb << 20,
        master_archive=args.master_archive,
        s3_endpoint=args.archive_s3_endpoint,
    )
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
