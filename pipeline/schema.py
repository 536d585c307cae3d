"""The rows of the ``tidemq`` source, in the spirit of Spark's Kafka source.

=================  ===================  ==================================================
column             type                 meaning
=================  ===================  ==================================================
key                binary (nullable)    the sharding key the message was sent with
value              binary               the body
topic              string
queue              int                  queue id within its broker group
offset             long                 position in the queue (ConsumeQueue index)
timestamp          timestamp            when the broker stored it
tag                string (nullable)
keys               array<string>        the message's index keys
properties         map<string,string>   user properties
msg_id             string               offset message id (store host + CommitLog offset)
born_timestamp     timestamp            the producer's clock when it sent the message
broker             string               the broker group (a topic may span several)
=================  ===================  ==================================================

``read()`` yields Arrow record batches built here: the Python-to-JVM path then copies columns,
not rows, and Spark checks them against ``SCHEMA``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq.types import ReceivedMessage

# RocketMQ 5's property for a message's sharding key; the sink writes the ``key`` column here.
SHARDING_KEY_PROPERTY: Final = "__SHARDINGKEY"

SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), False),
        StructField("topic", StringType(), False),
        StructField("queue", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("tag", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("msg_id", StringType(), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("broker", StringType(), False),
    ]
)

# Spark hands timestamps to Python workers as UTC microseconds.
_ARROW: Final = to_arrow_schema(SCHEMA, timezone="UTC")


def to_record_batch(messages: Sequence[ReceivedMessage]) -> pa.RecordBatch:
    keys: list[bytes | None] = []
    properties: list[list[tuple[str, str]]] = []
    for m in messages:
        props = m.properties
        key = props.get(SHARDING_KEY_PROPERTY)
        keys.append(None if key is None else key.encode())
        properties.append([(k, v) for k, v in props.items() if k != SHARDING_KEY_PROPERTY])
    columns = [
        pa.array(keys, pa.binary()),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([m.queue_id for m in messages], pa.int32()),
        pa.array([m.queue_offset for m in messages], pa.int64()),
        _timestamps([m.store_timestamp_ms for m in messages]),
        pa.array([m.tag for m in messages], pa.string()),
        pa.array([list(m.keys) for m in messages], _ARROW.field("keys").type),
        pa.array(properties, _ARROW.field("properties").type),
        pa.array([m.msg_id for m in messages], pa.string()),
        _timestamps([m.born_timestamp_ms for m in messages]),
        pa.array([m.broker for m in messages], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW)


def _timestamps(ms: list[int]) -> pa.Array:
    return pa.array([t * 1000 for t in ms], _ARROW.field("timestamp").type)
