"""The ``tidemq`` Spark source and sink against real nameserver and broker processes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import tidemq
from tests.integration.conftest import (
    SMALL_STORE,
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.waiting import wait_until
from tidemq.types import SendResult

pytestmark = pytest.mark.spark


@dataclass
class Cluster:
    nameserver: NameServerProcess
    broker: BrokerProcess
    start_broker: StartBroker
    port: int
    flags: tuple[str, ...]

    @property
    def address(self) -> str:
        return self.nameserver.address

    def restart_broker(self) -> None:
        self.broker.terminate()
        self.broker = self.start_broker(*self.flags, store="broker-a", port=self.port)
        _wait_routed(self.address)


def _wait_routed(nameserver: str) -> None:
    with tidemq.Admin(nameserver) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master broker routed")


def _start_cluster(
    start_nameserver: StartNameServer, start_broker: StartBroker, *extra: str
) -> Cluster:
    ns = start_nameserver()
    port = free_port()
    flags = (
        "--nameserver",
        ns.address,
        "--broker-name",
        "broker-a",
        "--auto-create-topics",
        *extra,
    )
    broker = start_broker(*flags, store="broker-a", port=port)
    _wait_routed(ns.address)
    return Cluster(ns, broker, start_broker, port, flags)


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    return _start_cluster(start_nameserver, start_broker)


def produce(
    nameserver: str, topic: str, n: int, first: int = 0, queues: int = 4
) -> list[SendResult]:
    """``n`` messages: body ``m<i>``, tag a/b alternating, key ``k<i>``, property i.

    One send at a time, so that each is its own request and the round robin (which places
    requests, not messages) spreads them evenly over the queues, in order, starting at queue 0.
    """
    with tidemq.Admin(nameserver) as admin:
        if topic not in admin.list_topics():
            admin.create_topic(topic, queues=queues)
    with tidemq.Producer(nameserver) as producer:
        results = [
            producer.send(
                topic,
                f"m{i}".encode(),
                tag="ab"[i % 2],
                keys=[f"k{i}"],
                properties={"i": str(i)},
            )
            for i in range(first, first + n)
        ]
    assert all(r.ok for r in results)
    return results


def read(spark: SparkSession, nameserver: str, topic: str, **options: str) -> DataFrame:
    reader = spark.read.format("tidemq").option("nameserver", nameserver).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_returns_exactly_what_was_produced(
    spark: SparkSession, cluster: Cluster
) -> None:
    sent = produce(cluster.address, "orders", 200)
    df = read(spark, cluster.address, "orders")
    rows = df.collect()

    assert df.rdd.getNumPartitions() == 4  # one per queue
    got = {(r.queue, r.offset): r for r in rows}
    assert len(rows) == len(got) == 200
    for s in sent:
        r = got[s.queue_id, s.queue_offset]
        i = int(r.value.decode()[1:])
        assert (r.topic, r.broker, r.msg_id) == ("orders", "broker-a", s.msg_id)
        assert (r.tag, r.keys, r.properties, r.key) == ("ab"[i % 2], [f"k{i}"], {"i": str(i)}, None)
        assert r.timestamp >= r.born_timestamp
    assert sorted(int(r.value.decode()[1:]) for r in rows) == list(range(200))


def test_batch_read_honours_offsets_and_tags(spark: SparkSession, cluster: Cluster) -> None:
    produce(cluster.address, "orders", 80)  # 20 per queue; queues 0 and 2 hold tag a
    starting = json.dumps({"orders": {"0": 5, "1": -2, "3": 10}})
    ending = json.dumps({"orders": {"0": 15, "2": 4}})
    rows = read(
        spark, cluster.address, "orders", startingOffsets=starting, endingOffsets=ending
    ).collect()
    by_queue: dict[int, list[int]] = {}
    for r in rows:
        by_queue.setdefault(r.queue, []).append(r.offset)
    assert {q: sorted(v) for q, v in by_queue.items()} == {
        0: list(range(5, 15)),
        1: list(range(20)),
        2: list(range(4)),
        3: list(range(10, 20)),
    }
    tagged = read(spark, cluster.address, "orders", tags="b").collect()
    assert len(tagged) == 40 and {r.tag for r in tagged} == {"b"}

    with pytest.raises(PySparkException, match="past the queue's end"):
        read(spark, cluster.address, "orders", endingOffsets='{"orders": {"0": 999}}').collect()


def _stream_to_parquet(
    spark: SparkSession, nameserver: str, topic: str, out: Path, **options: str
) -> StreamingQuery:
    reader = (
        spark.readStream.format("tidemq")
        .option("nameserver", nameserver)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    return query


def _rows_per_batch(query: StreamingQuery) -> list[int]:
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


@pytest.mark.timeout(600)
def test_stream_restarted_across_a_broker_restart_yields_every_message_once(
    spark: SparkSession, cluster: Cluster, out_dir: Path
) -> None:
    produce(cluster.address, "events", 100)
    first = _stream_to_parquet(spark, cluster.address, "events", out_dir, maxOffsetsPerTrigger="40")
    # 25 per queue, at most 40 per batch spread over the 4 queues.
    assert _rows_per_batch(first) == [40, 40, 20]

    produce(cluster.address, "events", 30, first=100)
    cluster.restart_broker()
    produce(cluster.address, "events", 30, first=130)
    second = _stream_to_parquet(spark, cluster.address, "events", out_dir)
    assert _rows_per_batch(second) == [60]

    rows = spark.read.parquet(str(out_dir / "data")).collect()
    assert sorted(int(r.value.decode()[1:]) for r in rows) == list(range(160))
    assert len({(r.queue, r.offset) for r in rows}) == 160


def test_fail_on_data_loss_both_ways_after_retention(
    spark: SparkSession, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    store = json.loads(SMALL_STORE)
    store.update(
        commitlog_file_size_bytes=16 * 1024,
        consume_queue_entries_per_file=20,
        file_reserved_time_hours=1 / 3600,  # a second
        delete_when_hours=list(range(24)),
        clean_resource_interval_ms=200,
    )
    cluster = _start_cluster(start_nameserver, start_broker, "--store-overrides", json.dumps(store))
    produce(cluster.address, "old", 400, queues=2)  # ~50 KiB: several CommitLog files

    def start_deleted() -> bool:
        with tidemq.Admin(cluster.address) as admin:
            return all(q.min_offset > 0 for q in admin.queue_status("old"))

    wait_until(start_deleted, 60, "retention to delete the oldest messages of both queues")
    with tidemq.Admin(cluster.address) as admin:
        bounds = {q.queue_id: (q.min_offset, q.max_offset) for q in admin.queue_status("old")}
    from_zero = json.dumps({"old": {"0": 0, "1": 0}})

    with pytest.raises(PySparkException, match="deleted by retention"):
        read(spark, cluster.address, "old", startingOffsets=from_zero).collect()

    rows = read(
        spark, cluster.address, "old", startingOffsets=from_zero, failOnDataLoss="false"
    ).collect()
    assert rows
    for qid, (lo, hi) in bounds.items():
        offsets = sorted(r.offset for r in rows if r.queue == qid)
        # Retention may have gone further since the bounds were read, never back; a queue whose
        # records all lay in deleted files has none left (lo == hi), and reads as empty.
        start = offsets[0] if offsets else hi
        assert start >= lo and offsets == list(range(start, hi))


def _consume(nameserver: str, topic: str, expected: int) -> list[tidemq.ReceivedMessage]:
    got: list[tidemq.ReceivedMessage] = []
    with tidemq.Consumer(nameserver, group="check", topic=topic, start_from="first") as c:

        def polled_all() -> bool:
            got.extend(c.poll(256, 0.5))
            return len(got) >= expected

        wait_until(polled_all, 60, f"{expected} messages in {topic}")
    return got


def test_batch_write_lands_in_the_topic_with_tags_keys_and_properties(
    spark: SparkSession, cluster: Cluster
) -> None:
    rows = [
        Row(
            value=f"v{i}",
            key=f"cust-{i % 3}",
            tag="ab"[i % 2],
            keys=[f"order-{i}", "batch"],
            properties={"i": str(i)},
        )
        for i in range(60)
    ]
    df = spark.createDataFrame(rows).repartition(3)
    df.write.format("tidemq").option("nameserver", cluster.address).option("topic", "written").mode(
        "append"
    ).save()

    got = _consume(cluster.address, "written", 60)
    assert sorted(m.body.decode() for m in got) == sorted(f"v{i}" for i in range(60))
    queues_of_key: dict[str, set[int]] = {}
    for m in got:
        i = int(m.body.decode()[1:])
        assert (m.tag, m.keys) == ("ab"[i % 2], (f"order-{i}", "batch"))
        assert m.properties == {"i": str(i), "__SHARDINGKEY": f"cust-{i % 3}"}
        queues_of_key.setdefault(f"cust-{i % 3}", set()).add(m.queue_id)
    assert all(len(q) == 1 for q in queues_of_key.values())  # one key, one queue

    with pytest.raises(PySparkException, match="append"):
        df.write.format("tidemq").option("nameserver", cluster.address).option(
            "topic", "written"
        ).mode("overwrite").save()


def test_stream_write_copies_a_topic_with_topic_column(
    spark: SparkSession, cluster: Cluster, out_dir: Path
) -> None:
    produce(cluster.address, "source", 50)
    query = (
        spark.readStream.format("tidemq")
        .option("nameserver", cluster.address)
        .option("topic", "source")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("value", "tag", "keys", "'copy' AS topic")
        .writeStream.format("tidemq")
        .option("nameserver", cluster.address)
        .option("checkpointLocation", str(out_dir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None

    got = _consume(cluster.address, "copy", 50)
    assert sorted((m.body, m.tag, m.keys) for m in got) == sorted(
        (f"m{i}".encode(), "ab"[i % 2], (f"k{i}",)) for i in range(50)
    )


def test_refused_send_fails_the_task_with_the_brokers_error(
    spark: SparkSession, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    store = {**json.loads(SMALL_STORE), "max_message_body_bytes": 1024}
    cluster = _start_cluster(start_nameserver, start_broker, "--store-overrides", json.dumps(store))
    df = spark.createDataFrame([Row(value=b"x" * n) for n in (10, 2048, 10)]).coalesce(1)
    write: Callable[[], Any] = (
        df.write.format("tidemq")
        .option("nameserver", cluster.address)
        .option("topic", "limited")
        .mode("append")
        .save
    )
    with pytest.raises(PySparkException, match="BODY_TOO_LARGE"):
        write()
