"""``format("tidemq_segments")``: the records of archived CommitLog segment files as a table.

Options: ``path`` (or ``load(path)``): a directory, a glob or a file; ``paths``: several, as a
JSON list; ``splitBytes``: bytes of a file per Spark partition (default 64 MiB). Each row is a
record whose CRCs were verified (``problem`` null) or a corrupt span (``problem`` says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq.pipeline.jobs.segments import ScannedRecord, Split, find_segments, scan_split, splits

DEFAULT_SPLIT_BYTES: Final = 64 << 20
ROWS_PER_BATCH: Final = 8192

# Built by hand: StructType.fromDDL needs a JVM, and workers import this module without one.
SCHEMA: Final = StructType(
    [
        StructField("file", StringType(), False),
        StructField("file_offset", LongType(), False),
        StructField("phy_offset", LongType(), False),
        StructField("size", IntegerType(), False),
        StructField("problem", StringType(), True),
        StructField("topic", StringType(), True),
        StructField("queue", IntegerType(), True),
        StructField("queue_offset", LongType(), True),
        StructField("store_timestamp", TimestampType(), True),
        StructField("born_timestamp", TimestampType(), True),
        StructField("body_size", IntegerType(), True),
        StructField("tags", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("msg_id", StringType(), True),
    ]
)
_ARROW: Final = to_arrow_schema(SCHEMA, timezone="UTC")


@dataclass(frozen=True)
class SplitPartition(InputPartition):
    split: Split


def _micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


def to_record_batch(rows: Sequence[ScannedRecord]) -> pa.RecordBatch:
    columns = [
        [r.file for r in rows],
        [r.file_offset for r in rows],
        [r.phy_offset for r in rows],
        [r.size for r in rows],
        [r.problem for r in rows],
        [r.topic for r in rows],
        [r.queue_id for r in rows],
        [r.queue_offset for r in rows],
        [_micros(r.store_timestamp_ms) for r in rows],
        [_micros(r.born_timestamp_ms) for r in rows],
        [r.body_size for r in rows],
        [r.tags for r in rows],
        [list(r.keys) for r in rows],
        [r.msg_id for r in rows],
    ]
    arrays = [pa.array(c, f.type) for c, f in zip(columns, _ARROW, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=_ARROW)


def read_split(split: Split) -> Iterator[pa.RecordBatch]:
    rows: list[ScannedRecord] = []
    for rec in scan_split(split):
        rows.append(rec)
        if len(rows) >= ROWS_PER_BATCH:
            yield to_record_batch(rows)
            rows = []
    if rows:
        yield to_record_batch(rows)


class SegmentReader(DataSourceReader):
    def __init__(self, paths: list[str], split_bytes: int) -> None:
        self.paths = paths
        self.split_bytes = split_bytes

    def partitions(self) -> list[SplitPartition]:
        return [SplitPartition(s) for s in splits(find_segments(self.paths), self.split_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        return read_split(partition.split)


def parse_paths(options: dict[str, str]) -> list[str]:
    paths = [options["path"]] if options.get("path") else []
    if options.get("paths"):
        raw = options["paths"]
        extra = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
        paths += [str(p) for p in extra]
    if not paths:
        raise ValueError('tidemq_segments needs "path" (or load(path)) or "paths"')
    return paths


class SegmentDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidemq_segments"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> SegmentReader:
        opts = {k.lower(): v for k, v in self.options.items()}
        split_bytes = int(opts.get("splitbytes", DEFAULT_SPLIT_BYTES))
        if split_bytes <= 0:
            raise ValueError('"splitBytes" must be > 0')
        return SegmentReader(parse_paths(opts), split_bytes)
