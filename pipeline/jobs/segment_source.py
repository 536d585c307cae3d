"""``format("tidemq_segments")``: the records of CommitLog segment files as a table, read from
copies of a broker's ``commitlog/`` directory or straight from an archive (docs/archive.md).

Options: ``path`` (or ``load(path)``): a directory, a glob or a file; ``paths``: several, as a
JSON list (or separated by ``,``); ``archive``: an archive's URI (a directory path,
``file:///PATH`` or ``s3://BUCKET/PREFIX``); ``archives``: several, as ``paths``;
``archiveS3Endpoint``: the endpoint of an S3-compatible store other than AWS's; ``splitBytes``:
bytes of a local file per Spark partition (default 64 MiB; an archived file is one partition);
``includeBody``: ``true`` adds the ``body`` column. Each row is a record whose CRCs were
verified (``problem`` null) or a corrupt span (``problem`` says why). An archived file whose
objects fail their checksums fails the query, naming the object; none of its rows are read.
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
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq.pipeline.jobs.archive import ArchiveLocation, locations
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
# With ``includeBody``: the record's body (null for a corrupt span).
BODY_SCHEMA: Final = StructType([*SCHEMA.fields, StructField("body", BinaryType(), True)])
_ARROW: Final = to_arrow_schema(SCHEMA, timezone="UTC")
_BODY_ARROW: Final = to_arrow_schema(BODY_SCHEMA, timezone="UTC")
OPTIONS: Final = frozenset(
    {"path", "paths", "archive", "archives", "archives3endpoint", "splitbytes", "includebody"}
)


@dataclass(frozen=True)
class SplitPartition(InputPartition):
    split: Split


def _micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


def to_record_batch(rows: Sequence[ScannedRecord], include_body: bool = False) -> pa.RecordBatch:
    columns: list[list[object]] = [
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
    schema = _ARROW
    if include_body:
        columns.append([r.body for r in rows])
        schema = _BODY_ARROW
    arrays = [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_split(split: Split, include_body: bool = False) -> Iterator[pa.RecordBatch]:
    rows: list[ScannedRecord] = []
    for rec in scan_split(split, include_body=include_body):
        rows.append(rec)
        if len(rows) >= ROWS_PER_BATCH:
            yield to_record_batch(rows, include_body)
            rows = []
    if rows:
        yield to_record_batch(rows, include_body)


class SegmentReader(DataSourceReader):
    def __init__(
        self,
        paths: list[str],
        split_bytes: int,
        archives: Sequence[ArchiveLocation] = (),
        include_body: bool = False,
    ) -> None:
        self.paths = paths
        self.split_bytes = split_bytes
        self.archives = list(archives)
        self.include_body = include_body

    def partitions(self) -> list[SplitPartition]:
        segments = find_segments(self.paths, self.archives)
        return [SplitPartition(s) for s in splits(segments, self.split_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        return read_split(partition.split, self.include_body)


def _several(options: dict[str, str], one: str, many: str) -> list[str]:
    """``one`` (a single value) and ``many`` (a JSON list, or values separated by ``,``)."""
    out = [options[one]] if options.get(one) else []
    raw = options.get(many, "")
    if raw.strip():
        try:
            extra = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
        except json.JSONDecodeError as e:
            raise ValueError(f'tidemq_segments option "{many}" is not a JSON list: {e}') from None
        out += [str(p).strip() for p in extra if str(p).strip()]
    return out


def parse_paths(options: dict[str, str]) -> list[str]:
    return _several(options, "path", "paths")


def parse_archives(options: dict[str, str]) -> list[ArchiveLocation]:
    uris = _several(options, "archive", "archives")
    endpoint = options.get("archives3endpoint", "").strip() or None
    if endpoint is not None and not uris:
        raise ValueError('tidemq_segments: "archiveS3Endpoint" is set but no "archive" is')
    return locations(uris, endpoint)


def _bool(options: dict[str, str], name: str) -> bool:
    raw = options.get(name.lower(), "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f'tidemq_segments option "{name}" must be true or false, not {raw!r}')
    return raw == "true"


class SegmentDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "tidemq_segments"

    def _options(self) -> dict[str, str]:
        opts = {k.lower(): v for k, v in self.options.items()}
        unknown = sorted(set(opts) - OPTIONS)
        if unknown:
            raise ValueError(
                f"tidemq_segments: unknown option(s) {unknown}; known: path, paths, archive, "
                "archives, archiveS3Endpoint, splitBytes, includeBody"
            )
        return opts

    def schema(self) -> StructType:
        return BODY_SCHEMA if _bool(self._options(), "includeBody") else SCHEMA

    def reader(self, schema: StructType) -> SegmentReader:
        opts = self._options()
        raw = opts.get("splitbytes", str(DEFAULT_SPLIT_BYTES))
        try:
            split_bytes = int(raw)
        except ValueError:
            raise ValueError(f'"splitBytes" must be an integer, not {raw!r}') from None
        if split_bytes <= 0:
            raise ValueError('"splitBytes" must be > 0')
        paths, archives = parse_paths(opts), parse_archives(opts)
        if not paths and not archives:
            raise ValueError(
                'tidemq_segments needs "path" (or load(path)), "paths", "archive" or "archives"'
            )
        include_body = _bool(opts, "includeBody")
        if schema != (BODY_SCHEMA if include_body else SCHEMA):
            raise ValueError("tidemq_segments has a fixed schema; do not pass .schema(...)")
        return SegmentReader(paths, split_bytes, archives, include_body)
