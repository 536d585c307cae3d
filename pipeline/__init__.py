"""tidemq on Apache Spark: the ``tidemq`` data source and batch jobs over CommitLog segments.

::

    from tidemq.pipeline import register
    register(spark)
    df = spark.read.format("tidemq").option("nameserver", "127.0.0.1:9876") \\
        .option("topic", "orders").load()

``tidemq.pipeline.source`` holds the source and sink, ``tidemq.pipeline.jobs`` the audit and replica
comparison jobs. Needs the ``spark`` extra (pyspark and pyarrow) on the driver and every
executor: see docs/pipeline.md.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("tidemq")`` and ``format("tidemq_segments")`` known to ``spark``
    (registration is per SparkSession)."""
    # Imported here: `import pipeline` (the CLI lists the jobs' arguments) must not need pyspark.
    from tidemq.pipeline.jobs.segment_source import SegmentDataSource  # noqa: PLC0415
    from tidemq.pipeline.source import TidemqDataSource  # noqa: PLC0415

    spark.dataSource.register(TidemqDataSource)
    spark.dataSource.register(SegmentDataSource)
