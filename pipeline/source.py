"""The ``tidemq`` data source: ``spark.read`` / ``spark.readStream`` of topics, and the sink.

Where each part runs (Spark's Python Data Source API): ``partitions()``, ``initialOffset()`` and
``latestOffset()`` run in a planner Python process on the driver side; ``read()`` runs in
executor workers, once per partition, and opens its own gRPC channels there. Readers are pickled
between those processes, so they hold options only; broker clients are opened on first use and
dropped when pickled.

A partition is one queue's offset range ``[start, end)``. Given the same range, ``read()``
returns the same messages, which is what lets Spark replay a micro-batch after a failure and a
file sink write each message exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemq.pipeline.offsets import (
    Offsets,
    QueueBounds,
    from_json_dict,
    limit_rows,
    resolve,
    to_json_dict,
)
from tidemq.pipeline.options import OptionError, ReadOptions, WriteOptions
from tidemq.pipeline.queues import QueueTable
from tidemq.pipeline.schema import SCHEMA, to_record_batch
from tidemq.pipeline.sink import TidemqBatchWriter, TidemqStreamWriter, check_write_schema
from tidemq.reader import QueueReader
from tidemq.routes import MessageQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: offsets [start, end) of one queue."""

    key: MessageQueue
    start: int
    end: int
    # A queue that appeared while a stream ran starts at 0; what retention already deleted of
    # it was never promised to the query, so it is skipped without counting as data loss.
    new_queue: bool = False


def read_range(options: ReadOptions, part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The messages of one partition as Arrow batches (runs on an executor)."""
    with QueueReader(options.nameserver, retry_timeout_ms=options.pull_timeout_ms) as reader:
        for batch in reader.read_range(
            part.key,
            part.start,
            part.end,
            tags=options.tags,
            fail_on_data_loss=options.fail_on_data_loss and not part.new_queue,
            max_messages=options.pull_batch_messages,
            max_bytes=options.pull_max_bytes,
        ):
            yield to_record_batch(batch)


def _ranges(
    start: dict[MessageQueue, int], end: dict[MessageQueue, int], *, new_queues: bool
) -> list[QueueRange]:
    out = []
    for key in sorted(end):
        known = key in start
        lo = start[key] if known else 0
        if end[key] > lo:
            out.append(QueueRange(key, lo, end[key], new_queue=new_queues and not known))
    return out


def _nothing_to_read(partition: InputPartition) -> bool:
    """Spark reads a batch whose ``partitions()`` are none (every range empty: e.g. a
    startingTimestamp later than every message) through one ``InputPartition(None)``."""
    return type(partition) is InputPartition and partition.value is None


class _Planner:
    """The options plus a lazily opened queue table; pickles without the table."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._table: QueueTable | None = None

    def table(self) -> QueueTable:
        if self._table is None:
            self._table = QueueTable(self.options.nameserver, self.options.topics)
        return self._table

    def bounds(self) -> dict[MessageQueue, QueueBounds]:
        return self.table().bounds()

    def starts(self, bounds: dict[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        """Where the query starts in each queue: startingTimestamp through the brokers'
        offset search, else startingOffsets."""
        ms = self.options.starting_timestamp_ms
        if ms is not None:
            return self.table().offsets_at(ms, bounds)
        return resolve(self.options.starting, bounds, name="startingOffsets", ending=False)

    def ends(self, bounds: dict[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        """Where a batch query stops: endingTimestamp, else endingOffsets."""
        ms = self.options.ending_timestamp_ms
        if ms is not None:
            return self.table().offsets_at(ms, bounds)
        return resolve(self.options.ending, bounds, name="endingOffsets", ending=True)

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_table": None}


class TidemqBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[QueueRange]:
        planner = _Planner(self.options)
        try:
            bounds = planner.bounds()
            start = planner.starts(bounds)
            end = planner.ends(bounds)
        finally:
            planner.close()
        o = self.options
        ending = "endingTimestamp" if o.ending_timestamp_ms is not None else "endingOffsets"
        starting = "startingTimestamp" if o.starting_timestamp_ms is not None else "startingOffsets"
        for key in bounds:
            if end[key] < start[key]:
                raise OptionError(
                    f"{ending} (offset {end[key]} of {key}) is before {starting} "
                    f"(offset {start[key]})"
                )
        return _ranges(start, end, new_queues=False)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if _nothing_to_read(partition):
            return iter(())
        assert isinstance(partition, QueueRange)
        return read_range(self.options, partition)


class TidemqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per queue (``tidemq.pipeline.offsets``), kept only in Spark's checkpoint.

    ``commit`` is not needed: the checkpoint is the truth, and nothing on the brokers records
    the query's position (no consumer group)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._planner = _Planner(options)
        self._available_now: dict[MessageQueue, int] | None = None

    def initialOffset(self) -> Offsets:
        bounds = self._planner.bounds()
        return to_json_dict(self._planner.starts(bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest()

    def _latest(self) -> dict[MessageQueue, int]:
        return {k: b.max_offset for k, b in self._planner.bounds().items()}

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        begin = from_json_dict(start)
        latest = self._latest() if self._available_now is None else dict(self._available_now)
        # A queue the brokers no longer list (its group is down, the topic shrank) keeps its
        # position; one that only appeared now starts at 0.
        for key, off in begin.items():
            latest[key] = max(off, latest.get(key, off))
        if isinstance(limit, ReadMaxRows):
            latest = limit_rows(begin, latest, limit.max_rows)
        return to_json_dict(latest)

    def partitions(self, start: Offsets, end: Offsets) -> list[QueueRange]:
        return _ranges(from_json_dict(start), from_json_dict(end), new_queues=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if _nothing_to_read(partition):
            return iter(())
        assert isinstance(partition, QueueRange)
        return read_range(self.options, partition)

    def stop(self) -> None:
        self._planner.close()


class TidemqDataSource(DataSource):
    """``format("tidemq")``: options in ``pipeline.options``, rows in ``pipeline.schema``."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self) -> StructType:
        return SCHEMA

    def _read_options(self, schema: StructType, *, streaming: bool) -> ReadOptions:
        if schema != SCHEMA:
            raise OptionError("the tidemq source has a fixed schema; do not pass .schema(...)")
        return ReadOptions.parse(self.options, streaming=streaming)

    def reader(self, schema: StructType) -> TidemqBatchReader:
        return TidemqBatchReader(self._read_options(schema, streaming=False))

    def streamReader(self, schema: StructType) -> TidemqStreamReader:
        return TidemqStreamReader(self._read_options(schema, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError('a topic is a log: use mode("append"), "overwrite" has no meaning')
        options = WriteOptions.parse(self.options)
        check_write_schema(schema, options)
        return TidemqBatchWriter(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Spark offers Python sinks "append" and "complete"; in "complete" mode each trigger
        # sends the whole result table again, as Spark's Kafka sink does.
        options = WriteOptions.parse(self.options)
        check_write_schema(schema, options)
        return TidemqStreamWriter(options, schema)
