"""Batch jobs over CommitLog segments, copied from brokers or read from an archive: ``audit``
and ``compare``.

Run them with spark-submit (``spark-submit pipeline/jobs/audit.py SEGMENTS --out DIR``) or
through the CLI (``tidemq pipeline audit ...``). Their command-line arguments are defined here,
in a module that does not import pyspark, so the ``tidemq`` CLI can list them without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

DEFAULT_SPLIT_MB = 64


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--master",
        help="Spark master (default: spark-submit's, else local[2] when run from the CLI)",
    )
    p.add_argument(
        "--split-mb",
        type=int,
        default=DEFAULT_SPLIT_MB,
        help=f"MiB of a segment file per Spark task (default {DEFAULT_SPLIT_MB})",
    )


def job_main(
    argv: Sequence[str] | None,
    doc: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> int:
    """A job's ``main`` under spark-submit: its arguments, then ``run``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def add_archive_endpoint_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--archive-s3-endpoint",
        metavar="URL",
        help="the endpoint of an S3-compatible store other than AWS (MinIO, Ceph); default "
        "AWS_ENDPOINT_URL, else AWS. Credentials: boto3's usual places (AWS_ACCESS_KEY_ID, ...)",
    )


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "segments", nargs="*", help="segment files, directories of them, or globs (quoted)"
    )
    p.add_argument(
        "--archive",
        action="append",
        default=[],
        metavar="URI",
        help="an archive to read the archived CommitLog files of, directly: a directory, "
        "file:///PATH or s3://BUCKET/PREFIX (repeatable; with or without SEGMENTS)",
    )
    add_archive_endpoint_argument(p)
    p.add_argument("--out", required=True, help="output directory (Parquet tables + summary)")
    add_common_arguments(p)


def check_audit_arguments(args: argparse.Namespace) -> None:
    if not args.segments and not args.archive:
        raise ValueError("name segment files (SEGMENTS), an archive (--archive URI), or both")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "master_dir",
        metavar="MASTER",
        help="the master's CommitLog segment directory, or its archive (s3://BUCKET/PREFIX, "
        "file:///PATH, or a directory holding an archive's manifest/)",
    )
    p.add_argument(
        "slave_dir",
        metavar="SLAVE",
        help="the slave's CommitLog segment directory (or an archive, as MASTER)",
    )
    p.add_argument(
        "--master-archive",
        metavar="URI",
        help="the master's archive as well: segments MASTER no longer holds (retention "
        "deleted them once archived) are compared with their archived copies",
    )
    add_archive_endpoint_argument(p)
    p.add_argument("--out", help="also write the JSON report to this file")
    add_common_arguments(p)
