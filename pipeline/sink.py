"""The ``tidemq`` sink: ``df.write.format("tidemq")`` and ``df.writeStream.format("tidemq")``.

Columns: ``value`` (binary or string, required); optional ``key`` (binary or string: the sharding
key, so rows with one key land in one queue in order; kept in the ``__SHARDINGKEY`` property),
``tag`` (string), ``keys`` (array of strings, or one string), ``properties`` (map of strings),
``topic`` (string; the ``topic`` option overrides it). The columns the source adds
(``queue``, ``offset``, ``timestamp``, ``msg_id``, ``born_timestamp``, ``broker``) are ignored,
so rows read from one topic can be written to another; any other column is an error.

Each task sends its rows through one SDK ``Producer``, which batches them into few requests,
and waits for every answer before it reports success. A row the brokers refuse fails the task
with the broker's error. Delivery is at least once: a task that Spark retries sends its rows
again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from tidemq.pipeline.options import OptionError, WriteOptions
from tidemq.pipeline.schema import SHARDING_KEY_PROPERTY
from tidemq.producer import Producer, SendFuture
from tidemq.types import SendStatus

log = logging.getLogger(__name__)

_TEXT_OR_BYTES = (StringType(), BinaryType())
_WRITABLE: dict[str, tuple[DataType, ...]] = {
    "value": _TEXT_OR_BYTES,
    "key": _TEXT_OR_BYTES,
    "tag": (StringType(),),
    "keys": (ArrayType(StringType(), True), ArrayType(StringType(), False), StringType()),
    "properties": (
        MapType(StringType(), StringType(), True),
        MapType(StringType(), StringType(), False),
    ),
    "topic": (StringType(),),
}
_IGNORED = frozenset({"queue", "offset", "timestamp", "msg_id", "born_timestamp", "broker"})
# Answers checked this often, so a refused row stops the task soon, not after the last row.
_CHECK_EVERY_ROWS = 4096


def check_write_schema(schema: StructType, options: WriteOptions) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    problems = []
    if "value" not in fields:
        problems.append('a "value" column is required')
    if "topic" not in fields and options.topic is None:
        problems.append('a "topic" column or the "topic" option is required')
    for name, dtype in fields.items():
        if name in _IGNORED:
            continue
        allowed = _WRITABLE.get(name)
        if allowed is None:
            problems.append(
                f"unknown column {name!r} (writable: {sorted(_WRITABLE)}; ignored: "
                f"{sorted(_IGNORED)})"
            )
        elif dtype not in allowed:
            problems.append(
                f"column {name!r} is {dtype.simpleString()}, expected one of "
                + ", ".join(t.simpleString() for t in allowed)
            )
    if problems:
        raise OptionError("cannot write to tidemq: " + "; ".join(problems))


@dataclass(frozen=True)
class SentMessages(WriterCommitMessage):
    partition_id: int
    attempt: int
    sent: int
    # Stored, but less durable than the brokers were asked for (FLUSH_SLAVE_TIMEOUT, ...).
    not_ok: int


def _text(value: str | bytes | None, column: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"column {column!r} holds bytes that are not UTF-8 text") from None


def _rows(batch: pa.RecordBatch, topic_option: str | None) -> Iterator[dict[str, Any]]:
    n = batch.num_rows
    names = batch.schema.names
    cols = {name: batch.column(name).to_pylist() for name in names if name in _WRITABLE}
    none = [None] * n
    values, keys_col, tags = cols["value"], cols.get("keys", none), cols.get("tag", none)
    keys, props, topics = cols.get("key", none), cols.get("properties", none), cols.get("topic")
    for i in range(n):
        value = values[i]
        if value is None:
            raise OptionError('a row has a null "value"')
        topic = topic_option or (topics[i] if topics is not None else None)
        if not topic:
            raise OptionError('a row has no "topic" (null column and no "topic" option)')
        properties = dict(props[i]) if props[i] else {}
        key = _text(keys[i], "key")
        if key is not None:
            properties[SHARDING_KEY_PROPERTY] = key
        row_keys = keys_col[i]
        yield {
            "topic": topic,
            "body": value,
            "tag": tags[i],
            "keys": [row_keys] if isinstance(row_keys, str) else (row_keys or ()),
            "properties": properties or None,
            "sharding_key": key,
        }


def send_all(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> SentMessages:
    """Send every row; raise the first refusal (runs on an executor)."""
    ctx = TaskContext.get()
    partition_id = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    futures: list[SendFuture] = []
    with Producer(
        options.nameserver,
        batch_max_messages=options.batch_max_messages,
        linger_ms=options.linger_ms,
    ) as producer:
        for batch in batches:
            for row in _rows(batch, options.topic):
                futures.append(producer.send_async(**row))
                if len(futures) % _CHECK_EVERY_ROWS == 0:
                    _raise_first_failure(futures[-_CHECK_EVERY_ROWS:], wait=False)
        _raise_first_failure(futures, wait=True)
    not_ok = sum(1 for f in futures if f.result().status is not SendStatus.SEND_OK)
    return SentMessages(partition_id, attempt, len(futures), not_ok)


def _raise_first_failure(futures: list[SendFuture], *, wait: bool) -> None:
    for f in futures:
        if wait or f.done():
            error = f.exception()
            if error is not None:
                raise error


def _sent(messages: list[WriterCommitMessage | None]) -> list[SentMessages]:
    return [m for m in messages if isinstance(m, SentMessages)]


def _log_commit(messages: list[WriterCommitMessage | None], what: str) -> None:
    done = _sent(messages)
    not_ok = sum(m.not_ok for m in done)
    log.info("%s: %d messages sent by %d tasks", what, sum(m.sent for m in done), len(done))
    if not_ok:
        log.warning("%s: %d messages stored with less durability than asked for", what, not_ok)


class _RowSender:
    """``write()`` of both writers: runs on executors, one ``Producer`` per task."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessages:
        return send_all(self.options, iterator)


class TidemqBatchWriter(_RowSender, DataSourceArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(messages, "batch write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What was sent stays sent: a topic has no transaction to roll back.
        done = sum(m.sent for m in _sent(messages))
        log.warning("batch write failed; %d messages of finished tasks were already sent", done)


class TidemqStreamWriter(_RowSender, DataSourceStreamArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = sum(m.sent for m in _sent(messages))
        log.warning("micro-batch %d failed; %d messages were already sent", batchId, done)
