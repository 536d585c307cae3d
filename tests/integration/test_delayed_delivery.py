"""Delayed delivery through a real broker and the SDK: a delayed message is invisible until its
delivery time and visible within a second after it; delay levels; recall; a past time is now; a
time beyond max_delay_ms is refused and stores nothing; the pending list."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Iterator

import pytest

import tidemq
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.integration.delayed import Arrivals, list_delayed
from tests.integration.receive_cluster import create_topic, routed_broker
from tests.integration.receiving import scrape
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "reminders"
LATE_MS = 1_000


def serving(
    start_broker: StartBroker,
    nameserver: NameServerProcess,
    *flags: str,
    queues: int = 1,
    topics: tuple[str, ...] = (TOPIC,),
) -> BrokerProcess:
    """One routed broker (with ``flags``) serving ``topics``."""
    broker = routed_broker(start_broker, nameserver, *flags)
    for topic in topics:
        create_topic(nameserver, topic, queues=queues)
    return broker


@contextlib.contextmanager
def producing_and_watching(nameserver: str) -> Iterator[tuple[tidemq.Producer, Arrivals]]:
    """A producer, and a consumer recording what arrives in TOPIC."""
    with tidemq.Producer(nameserver) as producer, Arrivals(nameserver, TOPIC) as seen:
        yield producer, seen


def test_a_delayed_message_arrives_no_earlier_than_due_within_a_second_as_it_was_sent(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    serving(start_broker, nameserver, queues=2)
    with producing_and_watching(nameserver.address) as (producer, seen):
        now = time.time()
        results = {}
        for i, delay in enumerate((1.0, 2.5, 1.5)):
            body = f"d{i}".encode()
            results[body] = producer.send(
                TOPIC,
                body,
                tag="remind",
                keys=[f"key{i}"],
                properties={"who": "alice"},
                delay=delay,
            )
        at = dt.datetime.fromtimestamp(now + 2, tz=dt.UTC)
        results[b"at"] = producer.send(TOPIC, b"at", deliver_at=at)
        for body, r in results.items():
            assert r.ok and r.recall_handle and r.deliver_at_ms > now * 1000, (body, r)
            assert r.queue_offset == -1
        assert results[b"at"].deliver_at_ms == round((now + 2) * 1000)
        wait_until(lambda: seen.count() == 4, 15, "the four delayed messages")
    for body, r in results.items():
        m = seen.got[body]
        assert m.store_timestamp_ms >= r.deliver_at_ms, f"{body!r} visible before it was due"
        assert m.store_timestamp_ms - r.deliver_at_ms <= LATE_MS, f"{body!r} late"
        assert m.topic == TOPIC and m.queue_id == r.queue_id
        assert m.properties.get("TIMER_DELIVER_MS") == str(r.deliver_at_ms)
        assert "REAL_TOPIC" not in m.properties and "REAL_QID" not in m.properties
    d0 = seen.got[b"d0"]
    assert (d0.tag, d0.keys, d0.properties["who"]) == ("remind", ("key0",), "alice")
    assert seen.copies == dict.fromkeys(results, 1)


def test_delay_level_two_delivers_after_five_seconds(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    serving(start_broker, nameserver)
    with producing_and_watching(nameserver.address) as (producer, seen):
        before = time.time() * 1000
        r = producer.send(TOPIC, b"level2", delay_level=2)
        assert 5_000 <= r.deliver_at_ms - before <= 5_000 + 2_000
        wait_until(lambda: seen.has(b"level2"), 15, "the level-2 message")
    m = seen.got[b"level2"]
    assert r.deliver_at_ms <= m.store_timestamp_ms <= r.deliver_at_ms + LATE_MS


def test_a_recalled_message_is_never_delivered_and_recall_after_delivery_is_not_found(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    broker = serving(
        start_broker, nameserver, "--metrics-listen", metrics, topics=(TOPIC, "another-topic")
    )
    with producing_and_watching(nameserver.address) as (producer, seen):
        kept = producer.send(TOPIC, b"kept", delay=2)
        gone = producer.send(TOPIC, b"gone", delay=1)
        assert producer.recall(TOPIC, gone.recall_handle) == gone.msg_id
        with pytest.raises(tidemq.errors.DelayedMessageNotFound):
            producer.recall(TOPIC, gone.recall_handle)  # recalled already
        listed = list_delayed(broker, TOPIC)
        assert listed.total == 1 and [m.msg_id for m in listed.messages] == [kept.msg_id]
        wait_until(lambda: seen.has(b"kept"), 15, "the kept message")
        with pytest.raises(tidemq.errors.DelayedMessageNotFound):
            producer.recall(TOPIC, kept.recall_handle)  # delivered already
        with pytest.raises(tidemq.errors.InvalidArgumentError):
            producer.recall("another-topic", kept.recall_handle)
        with pytest.raises(tidemq.errors.InvalidArgumentError):
            producer.recall(TOPIC, "not-a-handle")
        # "gone" was due a second before "kept": had it not been recalled, it would be here.
        assert not seen.has(b"gone")
    assert list_delayed(broker, TOPIC).total == 0
    figures = scrape(metrics)
    assert figures[("tidemq_timer_delivered_total", ())] == 1
    assert figures[("tidemq_timer_recalled_total", ())] == 1
    assert figures[("tidemq_timer_lateness_seconds_count", ())] == 1
    assert figures[("tidemq_timer_lateness_seconds_bucket", (("le", "1.0"),))] == 1
    assert figures[("tidemq_timer_pending", ())] == 0


def test_a_time_already_past_is_delivered_now_in_its_topic(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    serving(start_broker, nameserver)
    with producing_and_watching(nameserver.address) as (producer, seen):
        r = producer.send(TOPIC, b"past", deliver_at=int(time.time() * 1000) - 60_000)
        assert r.ok and r.queue_offset == 0 and not r.recall_handle and r.deliver_at_ms == 0
        wait_until(lambda: seen.has(b"past"), 10, "the past message")
        assert "TIMER_DELIVER_MS" not in seen.got[b"past"].properties


def test_a_delay_beyond_max_delay_is_refused_and_nothing_is_stored(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = serving(start_broker, nameserver, "--max-delay-ms", "60000")
    with tidemq.Producer(nameserver.address) as producer:
        with pytest.raises(tidemq.errors.DelayTooLong) as e:
            producer.send(TOPIC, b"too-far", delay=61)
        assert not e.value.retriable
        ok = producer.send(TOPIC, b"near", delay=59)
    listed = list_delayed(broker)
    assert listed.total == 1 and listed.messages[0].msg_id == ok.msg_id


def test_the_pending_list_is_soonest_first_per_topic_with_the_total(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = serving(start_broker, nameserver, topics=(TOPIC, "other"))
    with tidemq.Producer(nameserver.address) as producer:
        late = producer.send(TOPIC, b"late", delay=300, tag="t", keys=["k"])
        soon = producer.send(TOPIC, b"soon", delay=100)
        producer.send("other", b"elsewhere", delay=50)
    listed = list_delayed(broker, TOPIC, limit=1)
    assert listed.total == 2
    assert [m.msg_id for m in listed.messages] == [soon.msg_id]
    assert list_delayed(broker).total == 3
    everything = list_delayed(broker, TOPIC).messages
    assert [m.msg_id for m in everything] == [soon.msg_id, late.msg_id]
    m = everything[1]
    assert (m.topic, m.tag, list(m.keys), m.recall_handle) == (
        TOPIC,
        "t",
        ["k"],
        late.recall_handle,
    )
    assert m.deliver_at_ms == late.deliver_at_ms


async def _async_round(nameserver: str) -> tuple[tidemq.SendResult, list[tidemq.SendResult], str]:
    async with tidemq.AsyncProducer(nameserver) as producer:
        one = await producer.send(TOPIC, b"async", delay=dt.timedelta(seconds=1))
        batch = await producer.send_batch(
            [
                tidemq.Message(TOPIC, b"batch-late", delay=1.5),
                tidemq.Message(TOPIC, b"batch-now"),
            ]
        )
        recalled = await producer.send(TOPIC, b"async-gone", delay_level=1)
        return one, batch, await producer.recall(TOPIC, recalled.recall_handle)


def test_async_producer_and_batches_carry_the_delivery_options(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    serving(start_broker, nameserver)
    with Arrivals(nameserver.address, TOPIC) as seen:
        one, (late, now), recalled_id = asyncio.run(_async_round(nameserver.address))
        assert one.recall_handle and late.recall_handle and recalled_id
        assert not now.recall_handle and now.queue_offset >= 0
        wait_until(lambda: seen.count() == 3, 15, "the async and batch messages")
        # Due at 1 s, before "batch-late": had the recall not worked, it would be here.
        assert not seen.has(b"async-gone")
    for body, r in ((b"async", one), (b"batch-late", late)):
        m = seen.got[body]
        assert r.deliver_at_ms <= m.store_timestamp_ms <= r.deliver_at_ms + LATE_MS
