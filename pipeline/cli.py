"""``tidemq pipeline audit|compare``: the Spark batch jobs of ``tidemq.pipeline.jobs`` from the
CLI (registered through the ``tidemq.commands`` entry point).

They need the ``spark`` extra (pyspark, pyarrow) and Java; without them the command says so.
From the CLI they run on ``local[2]`` unless ``--master`` names a cluster.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from tidemq.pipeline.jobs import add_audit_arguments, add_compare_arguments

LOCAL_MASTER = "local[2]"


def _run_job(module: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            job = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name not in ("pyspark", "pyarrow"):
                raise
            raise ValueError(
                f"{e.name} is not installed: pip install 'tidemq[spark]' (and Java 17+)"
            ) from None
        rc: int = job.run(args, default_master=LOCAL_MASTER)
        return rc

    return run


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="Spark batch jobs over archived CommitLog segments")
    psub = p.add_subparsers(dest="pipeline_command", required=True)
    a = psub.add_parser(
        "audit",
        help="verify every record's CRC; Parquet tables of records, damage and topics",
    )
    add_audit_arguments(a)
    a.set_defaults(func=_run_job("tidemq.pipeline.jobs.audit"))
    c = psub.add_parser(
        "compare", help="is a slave's CommitLog a byte-identical prefix of its master's?"
    )
    add_compare_arguments(c)
    c.set_defaults(func=_run_job("tidemq.pipeline.jobs.compare"))
