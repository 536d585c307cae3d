"""Admission and the byte-rate quota as pure decisions (no gRPC, no clock), and the broker
settings that configure them."""

import pytest

from tidemq.services.broker.admission import (
    Admission,
    AdmissionLimits,
    ByteRateQuota,
    Verdict,
)
from tidemq.services.broker.config import BrokerConfig
from tidemq.storage.errors import ConfigError

pytestmark = pytest.mark.unit

MIB = 1 << 20


def admission(**overrides: int) -> Admission[str]:
    limits = {
        "max_concurrent_rpcs": 100,
        "max_inflight_requests_per_connection": 2,
        "max_inflight_bytes_per_connection": 4 * MIB,
        "max_waiting_requests_per_connection": 3,
        "max_waiting_bytes_per_connection": 8 * MIB,
    }
    return Admission(AdmissionLimits(**{**limits, **overrides}))


def test_a_connection_over_its_running_limits_waits_in_order_and_others_run_at_once() -> None:
    a = admission()
    assert a.arrive("flood", "f1", 1 * MIB) is Verdict.ADMITTED
    assert a.arrive("flood", "f2", 1 * MIB) is Verdict.ADMITTED
    assert a.arrive("flood", "f3", 1 * MIB) is Verdict.WAITING  # two running already
    assert a.arrive("flood", "f4", 1 * MIB) is Verdict.WAITING
    assert a.arrive("good", "g1", 100) is Verdict.ADMITTED  # another connection: not queued
    assert a.leave("flood", 1 * MIB) == ["f3"]
    assert a.leave("flood", 1 * MIB) == ["f4"]
    assert a.running("flood") == (2, 2 * MIB)
    assert a.waiting("flood") == (0, 0)


def test_running_bytes_bound_a_connection_but_a_request_alone_always_runs() -> None:
    a = admission()
    assert a.arrive("c", "big", 64 * MIB) is Verdict.ADMITTED  # alone: runs, whatever its size
    assert a.arrive("c", "small", 1) is Verdict.WAITING  # 64 MiB already running
    assert a.leave("c", 64 * MIB) == ["small"]
    assert a.arrive("c", "3mib", 3 * MIB) is Verdict.ADMITTED  # 1 byte + 3 MiB <= 4 MiB
    assert a.running("c") == (2, 3 * MIB + 1)


def test_past_the_waiting_bounds_a_request_is_refused_and_nothing_is_counted() -> None:
    a = admission()
    for t in ("r1", "r2"):
        assert a.arrive("c", t, 10) is Verdict.ADMITTED
    for t in ("w1", "w2", "w3"):
        assert a.arrive("c", t, 10) is Verdict.WAITING
    assert a.arrive("c", "w4", 10) is Verdict.REFUSED  # 3 waiting already
    assert (a.waiting("c"), a.total, a.refused) == ((3, 30), 5, 1)


def test_waiting_bytes_are_bounded_by_what_requests_hold_not_what_they_may_cost() -> None:
    a = admission(max_waiting_requests_per_connection=100)
    a.arrive("c", "r1", 1)
    a.arrive("c", "r2", 1)
    # A pull costs the answer it may get (4 MiB) but holds only its request while it waits.
    for i in range(10):
        assert a.arrive("c", f"pull{i}", 4 * MIB, 50) is Verdict.WAITING
    assert a.waiting("c") == (10, 500)
    assert a.arrive("c", "send", 8 * MIB) is Verdict.REFUSED  # 500 + 8 MiB > 8 MiB
    a2 = admission()
    a2.arrive("c", "r1", 1)
    a2.arrive("c", "r2", 1)
    assert a2.arrive("c", "huge", 64 * MIB) is Verdict.WAITING  # alone it may wait, as run


def test_the_whole_broker_refuses_past_max_concurrent_rpcs() -> None:
    a = admission(max_concurrent_rpcs=3)
    for c in ("a", "b", "c"):
        assert a.arrive(c, c, 1) is Verdict.ADMITTED
    assert a.arrive("d", "d", 1) is Verdict.REFUSED
    a.leave("a", 1)
    assert a.arrive("d", "d", 1) is Verdict.ADMITTED


def test_a_long_poll_back_from_its_wait_waits_rather_than_be_refused() -> None:
    a = admission(max_waiting_requests_per_connection=0, max_concurrent_rpcs=2)
    a.arrive("c", "r1", 1)
    a.arrive("c", "r2", 1)
    assert a.arrive("c", "again", 1) is Verdict.REFUSED
    assert a.arrive("c", "poll", 1, may_refuse=False) is Verdict.WAITING
    assert a.leave("c", 1) == ["poll"]


def test_a_withdrawn_waiter_frees_its_place_and_one_admitted_meanwhile_must_leave() -> None:
    a = admission()
    a.arrive("c", "r1", 1)
    a.arrive("c", "r2", 1)
    a.arrive("c", "w1", 1)
    a.arrive("c", "w2", 1)
    assert a.withdraw("c", "w1")
    assert a.leave("c", 1) == ["w2"]
    assert not a.withdraw("c", "w2")  # admitted: it leaves like any running request
    assert a.total == 2


def test_a_held_back_connection_runs_nothing_more_until_released() -> None:
    a = admission()
    a.hold("c")
    a.hold("c")
    assert a.arrive("c", "next", 1) is Verdict.WAITING
    assert a.leave("c", 0) == ["next"]
    a.leave("c", 0)
    a.leave("c", 1)
    assert a.idle("c") and a.total == 0 and a.connections == 0


def test_a_connection_over_its_byte_rate_is_held_back_only_while_others_are_active() -> None:
    q = ByteRateQuota(bytes_per_second=4 * MIB)  # a burst of 1 MiB
    q.seen("flood", 0)
    assert q.charge("flood", 3 * MIB, 0) == 0  # alone: never held back, no debt kept
    assert q.charge("flood", 3 * MIB, 10) == 0
    q.seen("good", 20)
    q.seen("flood", 20)
    # In company: the bucket (emptied, not in debt, when alone) refilled 10 ms worth, then
    # 3 MiB charged: held back until the debt is refilled.
    delay = q.charge("flood", 3 * MIB, 20)
    assert delay == int((3 * MIB - 4 * MIB * 0.01) * 1000 / (4 * MIB)) + 1
    assert q.charge("good", 100, 21) == 0  # the quiet client is not held back
    # After the window with no sign of the other client, the flooder is alone again.
    q.seen("flood", 1_100)
    assert q.charge("flood", 3 * MIB, 1_100) == 0


def test_buckets_of_quiet_connections_are_dropped() -> None:
    q = ByteRateQuota(bytes_per_second=MIB)
    q.MAX_BUCKETS = 2
    for c in ("a", "b"):
        q.charge(c, 1, 0)
    q.charge("c", 1, 10_000)  # a and b have long filled up again
    assert set(q._buckets) == {"c"}


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("max_pull_response_bytes", 0, "max_pull_response_bytes must be > 0"),
        ("max_pull_response_bytes", 65 * MIB, "max_pull_response_bytes must be <="),
        ("max_concurrent_rpcs", 0, "max_concurrent_rpcs must be > 0"),
        ("max_inflight_requests_per_connection", 0, "max_inflight_requests_per_connection"),
        ("max_inflight_bytes_per_connection", -1, "max_inflight_bytes_per_connection"),
        ("max_waiting_requests_per_connection", 0, "max_waiting_requests_per_connection"),
        ("max_waiting_bytes_per_connection", 0, "max_waiting_bytes_per_connection"),
        ("max_bytes_per_second_per_connection", -1, "max_bytes_per_second_per_connection"),
    ],
)
def test_load_limit_settings_are_validated_once(setting: str, value: int, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        BrokerConfig("/tmp/x", **{setting: value})  # type: ignore[arg-type]
