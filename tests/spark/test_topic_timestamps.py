"""``startingTimestamp`` / ``endingTimestamp`` of the ``tidemq`` source (Spark's Kafka options):
resolved per queue through the brokers' offset search, against a real broker."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from tests.integration.conftest import StartBroker, StartNameServer
from tests.spark.test_connector import Cluster, _start_cluster, produce, read
from tests.waiting import wait_until
from tidemq.pipeline.options import OptionError, ReadOptions
from tidemq.pipeline.source import TidemqStreamReader
from tidemq.storage.clock import now_ms  # the clock the broker stamps store times with
from tidemq.types import SendResult

pytestmark = pytest.mark.spark

DAY_MS = 86_400_000


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    return _start_cluster(start_nameserver, start_broker)


def _past_now() -> int:
    """A clock reading later than every store time given so far (the broker runs on this
    machine's clock), and at most every store time given from now on."""
    seen = now_ms()
    wait_until(lambda: now_ms() > seen, 5, "the clock to move on by a millisecond")
    return now_ms()


def _sent(results: list[SendResult]) -> list[tuple[int, int]]:
    return sorted((s.queue_id, s.queue_offset) for s in results)


def test_timestamps_select_exactly_the_messages_stored_in_the_range(
    spark: SparkSession, cluster: Cluster
) -> None:
    ns = cluster.address
    first = produce(ns, "events", 40)  # m0..m39, 10 per queue
    t1 = _past_now()
    second = produce(ns, "events", 40, first=40)
    t2 = _past_now()
    third = produce(ns, "events", 40, first=80)

    def got(**options: str) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        rows = read(spark, ns, "events", **options).collect()
        bodies = sorted(int(r.value.decode()[1:]) for r in rows)
        stamps = sorted(int(r.timestamp.timestamp() * 1000) for r in rows)
        return bodies, sorted((r.queue, r.offset) for r in rows), stamps

    bodies, offsets, stamps = got(startingTimestamp=str(t1), endingTimestamp=str(t2))
    assert bodies == list(range(40, 80))
    assert offsets == _sent(second)
    assert t1 <= stamps[0] and stamps[-1] < t2

    bodies, offsets, _ = got(startingTimestamp=str(t2))
    assert (bodies, offsets) == (list(range(80, 120)), _sent(third))
    bodies, offsets, _ = got(endingTimestamp=str(t1))
    assert (bodies, offsets) == (list(range(40)), _sent(first))
    # With offsets on the other side: from t1, and queue 0 only up to its offset 15.
    bodies, _, _ = got(startingTimestamp=str(t1), endingOffsets='{"events": {"0": 15}}')
    assert bodies == [
        i
        for i, s in zip(range(40, 120), second + third, strict=True)
        if s.queue_id != 0 or s.queue_offset < 15
    ]
    # Before everything: every message; after everything: every queue starts at its end.
    assert got(startingTimestamp="0")[0] == list(range(120))
    assert got(startingTimestamp=str(now_ms() + DAY_MS))[0] == []

    # A stream starts where the search says (its first position, kept in the checkpoint).
    stream = TidemqStreamReader(
        ReadOptions.parse(
            {"nameserver": ns, "topic": "events", "startingTimestamp": str(t2)}, streaming=True
        )
    )
    try:
        start = stream.initialOffset()
    finally:
        stream.stop()
    firsts = {str(q): min(o for qq, o in _sent(third) if qq == q) for q in range(4)}
    assert start == {"events": {"broker-a": firsts}}

    with pytest.raises(PySparkException, match="give one of them"):
        got(startingTimestamp=str(t1), startingOffsets="earliest")


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"startingTimestamp": "yesterday"}, False, "milliseconds since the epoch"),
        ({"startingTimestamp": "-5"}, False, "milliseconds since the epoch"),
        ({"endingTimestamp": "1.5"}, False, "milliseconds since the epoch"),
        ({"endingTimestamp": str(1 << 63)}, False, "milliseconds since the epoch"),
        ({"startingTimestamp": "5", "startingOffsets": "latest"}, False, "give one of them"),
        ({"endingTimestamp": "5", "endingOffsets": "latest"}, False, "give one of them"),
        ({"startingTimestamp": "9", "endingTimestamp": "8"}, False, "is before"),
        ({"endingTimestamp": "5"}, True, "batch reads only"),
    ],
)
def test_bad_timestamp_options_are_refused_naming_them(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        ReadOptions.parse({"nameserver": "h:1", "topic": "t", **options}, streaming=streaming)
    good = ReadOptions.parse(
        {"nameserver": "h:1", "topic": "t", "startingTimestamp": " 7 ", "endingTimestamp": "7"},
        streaming=False,
    )
    assert (good.starting_timestamp_ms, good.ending_timestamp_ms) == (7, 7)
