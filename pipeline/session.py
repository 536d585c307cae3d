"""SparkSession for the jobs, the CLI and the tests, with the start-up settings measured on a
small machine (shared/guides/pyspark.md): a C1-only JIT and the serial GC halve the JVM's
start-up CPU, the UI is off, and a shuffle has as many partitions as there are cores."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from tidemq.pipeline import register

LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def local_conf(cores: int = 2) -> dict[str, str]:
    """Settings for ``local[cores]``: small, quick to start; not for a cluster."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.driver.extraJavaOptions": LOCAL_JVM_OPTIONS,
        # Local mode talks to itself only; without this Spark looks up the host's address.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


def get_session(app_name: str, master: str | None = None, **conf: Any) -> SparkSession:
    """The session of this process (created on first call), with ``format("tidemq")``
    registered. Without ``master`` (under spark-submit) Spark's own settings decide."""
    # Python workers start "python3" from PATH unless told otherwise; this interpreter has
    # pyarrow and tidemq installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            cores = master[len("local[") : -1] if master.startswith("local[") else "1"
            n = (os.cpu_count() or 2) if cores == "*" else int(cores)
            for k, v in local_conf(n).items():
                builder = builder.config(k, v)
    for k, v in conf.items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    register(spark)
    return spark
