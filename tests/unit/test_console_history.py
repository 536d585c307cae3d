"""The console's figures from made-up samples (no broker, no clock): rates, lag, the window,
the charts' aligned series, sessions, and the flags it refuses."""

from __future__ import annotations

import pytest

from tidemq.admin.offset_tables import GroupPosition, OffsetTable, QueueOffsets
from tidemq.console.cli import parse_listen
from tidemq.console.context import series_json
from tidemq.console.history import History
from tidemq.console.sampler import replication_lag
from tidemq.console.sessions import Sessions
from tidemq.protos.signing import Credentials


def table(
    queues: dict[tuple[str, int], tuple[int, int]],
    positions: list[GroupPosition] = (),  # type: ignore[assignment]
    broker: str = "broker-a",
) -> OffsetTable:
    return OffsetTable(
        broker, 0, {k: QueueOffsets(lo, hi) for k, (lo, hi) in queues.items()}, list(positions)
    )


def test_a_topics_produce_rate_is_its_queues_growth_per_second() -> None:
    h = History()
    h.record(10_000, [table({("orders", 0): (0, 100), ("orders", 1): (0, 50)})])
    h.record(12_000, [table({("orders", 0): (0, 300), ("orders", 1): (0, 150)})])
    assert h.produce_rate["orders"].last == pytest.approx(150.0)  # 300 messages in 2 s
    assert h.broker_produce_rate["broker-a"].last == pytest.approx(150.0)


def test_a_queue_that_appears_between_samples_is_not_counted_as_a_burst() -> None:
    h = History()
    h.record(0, [table({("orders", 0): (0, 10)})])
    h.record(1_000, [table({("orders", 0): (0, 10), ("orders", 1): (0, 5_000)})])
    assert h.produce_rate["orders"].last == 0


def test_lag_sums_each_queues_distance_and_consumption_is_the_positions_growth() -> None:
    h = History()
    queues = {("orders", 0): (0, 100), ("orders", 1): (0, 40)}
    h.record(0, [table(queues, [GroupPosition("demo", "orders", 0, 20)])])
    h.record(
        1_000,
        [
            table(
                queues,
                [GroupPosition("demo", "orders", 0, 60), GroupPosition("demo", "orders", 1, 40)],
            )
        ],
    )
    assert h.lag["demo", "orders"].last == 40  # 100-60 and 40-40
    assert h.consume_rate["demo", "orders"].last == 40  # queue 1 is new: only queue 0's 40 count
    (g,) = h.group_topics("demo")
    assert g.queues == (("broker-a", 0, 60, 40), ("broker-a", 1, 40, 0))
    assert h.group_lag() == {"demo": 40}


def test_an_offset_reset_backwards_is_no_consumption_and_a_position_past_the_end_no_lag() -> None:
    h = History()
    queues = {("orders", 0): (0, 100)}
    h.record(0, [table(queues, [GroupPosition("demo", "orders", 0, 90)])])
    h.record(1_000, [table(queues, [GroupPosition("demo", "orders", 0, 0)])])
    assert h.consume_rate["demo", "orders"].last == 0
    h.record(2_000, [table(queues, [GroupPosition("demo", "orders", 0, 150)])])
    assert h.lag["demo", "orders"].last == 0


def test_a_deleted_topics_positions_are_history_not_lag() -> None:
    h = History()
    h.record(0, [table({}, [GroupPosition("demo", "gone", 0, 5)])])
    assert ("demo", "gone") not in h.lag and h.group_lag() == {}


def test_receive_groups_carry_their_in_flight_and_retrying_messages() -> None:
    h = History()
    h.record(
        0,
        [
            table(
                {("orders", 0): (0, 10), ("orders", 1): (0, 10)},
                [
                    GroupPosition("billing", "orders", 0, 4, True, inflight=3, retrying=1),
                    GroupPosition("billing", "orders", 1, 10, True, inflight=0, retrying=2),
                ],
            )
        ],
    )
    (g,) = h.group_topics("billing")
    assert (g.receive, g.inflight, g.retrying, g.lag) == (True, 3, 3, 6)


def test_system_topics_have_no_rate_and_dead_letter_queues_are_counted_per_group() -> None:
    h = History()
    h.record(0, [table({("%SYS%RECEIVE_LOG", 0): (0, 0), ("%DLQ%billing", 0): (2, 7)})])
    h.record(1_000, [table({("%SYS%RECEIVE_LOG", 0): (0, 900), ("%DLQ%billing", 0): (2, 9)})])
    assert "%SYS%RECEIVE_LOG" not in h.produce_rate
    assert h.dlq_sizes() == {"billing": 7}


def test_points_older_than_the_window_are_dropped() -> None:
    h = History(window_ms=10_000)
    for t in range(0, 30_001, 1_000):
        h.record(t, [table({("orders", 0): (0, t)})])
    times = [t for t, _ in h.produce_rate["orders"].points]
    assert times[0] == 20_000 and times[-1] == 30_000


def test_chart_series_are_aligned_on_every_sample_time_with_gaps_as_null() -> None:
    h = History()
    h.record(0, [table({("a", 0): (0, 0)})])
    h.record(1_000, [table({("a", 0): (0, 10)})])
    h.record(2_000, [table({("a", 0): (0, 20), ("b", 0): (0, 0)})])
    h.record(3_000, [table({("a", 0): (0, 30), ("b", 0): (0, 5)})])
    assert series_json(h.produce_rate) == {
        "t": [1.0, 2.0, 3.0],
        "series": {"a": [10.0, 10.0, 10.0], "b": [None, 0.0, 5.0]},
    }


def test_replication_lag_names_each_slave_by_its_group_and_id() -> None:
    status = {
        "clusters": [
            {
                "cluster": "c",
                "brokers": [
                    {"broker_name": "broker-a", "replication": {"slaves": [
                        {"broker_id": 1, "lag_bytes": 4096}, {"broker_id": 2, "lag_bytes": 0},
                    ]}},
                    {"broker_name": "broker-a", "reachable": False},
                ],
            }
        ]
    }  # fmt: skip
    assert replication_lag(status) == {"broker-a/1": 4096, "broker-a/2": 0}


def test_a_session_ends_after_its_idle_time_and_checks_its_own_csrf_token() -> None:
    sessions = Sessions(idle_ms=1_000)
    s = sessions.open(Credentials("ops", "ops-secret"), now_ms=0)
    assert sessions.get(s.token, now_ms=900) is s
    assert sessions.check_csrf(s, s.csrf) and not sessions.check_csrf(s, "forged")
    assert not sessions.check_csrf(s, None)
    assert sessions.get(s.token, now_ms=1_800) is s  # each request renews it
    assert sessions.get(s.token, now_ms=2_900) is None
    assert sessions.get("unknown", now_ms=0) is None


@pytest.mark.parametrize("text", ["8080", "host:", "host:99999", "a b:80", "host:80\n"])
def test_a_bad_listen_address_is_refused_with_the_flag_named(text: str) -> None:
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(text)


def test_listen_addresses_parse_to_host_and_port() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen(":0") == ("0.0.0.0", 0)
    assert parse_listen("[::1]:80") == ("::1", 80)
