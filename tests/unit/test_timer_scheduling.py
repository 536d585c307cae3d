"""The send path's half of delayed delivery, without sockets or clocks: which messages are
delayed, the %SYS%TIMER record each becomes, what is refused (and that a refusal changes
nothing), and what a delayed message's SendResult says; the SDK's delivery options."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

import pytest

from tidemq.errors import InvalidArgumentError
from tidemq.producer.delivery import delivery
from tidemq.producer.recall import broker_of
from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker.timer.recall_handle import RecallHandle
from tidemq.services.broker.timer.scheduling import Delayed, Scheduling, timer_record
from tidemq.services.errors import ServiceError
from tidemq.storage import Message

NOW = 1_700_000_000_000
DAY_MS = 86_400_000


class R(NamedTuple):
    phy_offset: int
    queue_offset: int


class Put:
    def __init__(self, *phy_offsets: int) -> None:
        self.results = [R(p, i) for i, p in enumerate(phy_offsets)]


def scheduling(mark: int = -1, stored: list[Any] | None = None) -> Scheduling:
    into = stored if stored is not None else []
    return Scheduling("broker-a", 40 * DAY_MS, lambda: mark, lambda d, put: into.append((d, put)))


def wire(**fields: Any) -> common_pb2.Message:
    return common_pb2.Message(topic="orders", queue_id=3, body=b"x", **fields)


def store_message(**props: str) -> Message:
    return Message("orders", b"x", queue_id=3, tags="t", keys=("k",), properties=props)


def test_a_message_with_a_future_time_becomes_a_timer_record_that_says_where_and_when() -> None:
    batch = [store_message(a="1"), store_message()]
    delayed = scheduling().prepare([wire(delay_ms=5_000), wire()], batch, NOW)
    assert delayed == [Delayed(0, "orders", 3, NOW + 5_000)]
    r = batch[0]
    assert (r.topic, r.queue_id, r.tags, tuple(r.keys), r.body) == (
        "%SYS%TIMER",
        0,
        "t",
        ("k",),
        b"x",
    )
    assert r.properties == {
        "a": "1",
        "REAL_TOPIC": "orders",
        "REAL_QID": "3",
        "TIMER_DELIVER_MS": str(NOW + 5_000),
    }
    assert batch[1] == store_message()  # not delayed: untouched


@pytest.mark.parametrize(
    "fields",
    [{}, {"deliver_at_ms": NOW}, {"deliver_at_ms": NOW - 60_000}, {"deliver_at_ms": 1}],
    ids=["none", "now", "a minute ago", "epoch"],
)
def test_no_time_or_a_time_not_ahead_is_stored_directly_in_its_topic(
    fields: dict[str, int],
) -> None:
    batch = [store_message()]
    assert scheduling().prepare([wire(**fields)], batch, NOW) is None
    assert batch == [store_message()]


def test_a_time_at_or_before_the_last_fired_mark_is_stored_directly() -> None:
    # A timer record due at or before the mark would count as delivered already.
    batch = [store_message()]
    assert scheduling(mark=NOW + 10_000).prepare([wire(delay_ms=10_000)], batch, NOW) is None
    assert batch[0].topic == "orders"
    assert scheduling(mark=NOW + 10_000).prepare([wire(delay_ms=10_001)], batch, NOW)


def test_a_time_beyond_max_delay_is_refused_with_delay_too_long_and_nothing_changes() -> None:
    batch = [store_message(), store_message()]
    with pytest.raises(ServiceError) as e:
        scheduling().prepare([wire(delay_ms=1_000), wire(delay_ms=40 * DAY_MS + 1)], batch, NOW)
    assert e.value.code == common_pb2.DELAY_TOO_LONG and not e.value.retriable
    assert batch == [store_message(), store_message()]
    assert scheduling().prepare([wire(delay_ms=40 * DAY_MS)], batch, NOW)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"delay_ms": 1_000, "delay_level": 2}, common_pb2.INVALID_ARGUMENT),
        ({"delay_level": 19}, common_pb2.INVALID_ARGUMENT),
        ({"delay_ms": -5}, common_pb2.INVALID_ARGUMENT),
    ],
    ids=["two options", "level 19", "negative"],
)
def test_bad_delivery_options_are_invalid_argument(fields: dict[str, int], code: int) -> None:
    batch = [store_message()]
    with pytest.raises(ServiceError) as e:
        scheduling().prepare([wire(**fields)], batch, NOW)
    assert e.value.code == code
    assert batch == [store_message()]


def test_a_client_may_not_set_the_brokers_own_timer_properties_on_a_delayed_message() -> None:
    batch = [store_message(REAL_TOPIC="elsewhere")]
    with pytest.raises(ServiceError) as e:
        scheduling().prepare([wire(delay_level=1)], batch, NOW)
    assert e.value.code == common_pb2.INVALID_PROPERTY


def test_delay_level_counts_from_the_brokers_clock() -> None:
    batch = [store_message()]
    (d,) = scheduling().prepare([wire(delay_level=4)], batch, NOW) or []
    assert d.deliver_at_ms == NOW + 30_000


def test_a_delayed_result_names_its_queue_its_time_and_a_handle_to_its_timer_record() -> None:
    stored: list[Any] = []
    s = scheduling(stored=stored)
    batch = [store_message(), store_message()]
    delayed = s.prepare([wire(), wire(delay_ms=2_000)], batch, NOW) or []
    put = Put(100, 200)
    s.stored(delayed, put)
    assert stored == [(delayed, put)]
    results = broker_pb2.SendMessageResponse()
    for r in put.results:
        results.results.add(msg_id="m", queue_id=0, queue_offset=r.queue_offset)
    s.fill(delayed, results.results, put.results)
    plain, late = results.results
    assert (plain.recall_handle, plain.deliver_at_ms, plain.queue_offset) == ("", 0, 0)
    assert (late.queue_id, late.queue_offset, late.deliver_at_ms) == (3, -1, NOW + 2_000)
    assert RecallHandle.decode(late.recall_handle) == RecallHandle(
        "broker-a", "orders", 200, NOW + 2_000
    )
    # The SDK finds the broker group from the handle alone.
    assert broker_of(late.recall_handle) == "broker-a"


def test_the_timer_record_keeps_everything_the_producer_sent() -> None:
    m = Message("orders", b"body", 2, "t", ("k1", "k2"), {"UNIQ_KEY": "u"}, 7, 123)
    r = timer_record(m, NOW)
    assert (r.body, r.tags, r.keys, r.flag, r.born_timestamp_ms) == (
        b"body",
        "t",
        ("k1", "k2"),
        7,
        123,
    )
    assert r.properties["UNIQ_KEY"] == "u"


# ---------------------------------------------------------------- the SDK's options
def test_sdk_delivery_options_become_the_wire_fields() -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=dt.UTC)
    assert delivery(at, None, None) == (round(at.timestamp() * 1000), 0, 0)
    assert delivery(1_900_000_000_000, None, None) == (1_900_000_000_000, 0, 0)
    assert delivery(None, dt.timedelta(minutes=2), None) == (0, 120_000, 0)
    assert delivery(None, 1.5, None) == (0, 1_500, 0)
    assert delivery(None, None, 18) == (0, 0, 18)
    assert delivery(None, None, None) is None
    assert delivery(None, 0, None) is None  # no delay: a plain send


@pytest.mark.parametrize(
    "args",
    [
        (1, 1.0, None),
        (None, -1.0, None),
        (None, None, 0),
        (None, None, 19),
        ("soon", None, None),
        (None, None, True),
        (-5, None, None),
    ],
)
def test_sdk_refuses_bad_delivery_options_before_sending(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        delivery(*args)


@pytest.mark.parametrize("text", ["", "!!", "AAAA", RecallHandle("b", "t", 1, 2).encode()[4:]])
def test_sdk_refuses_a_handle_that_is_not_one(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        broker_of(text)
