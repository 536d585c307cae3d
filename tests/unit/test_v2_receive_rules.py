"""The rules of a v2 (apache.rocketmq.v2) receive before the broker's receive path: long-poll
time within the call's deadline, invisible times, batch size, filters, the ack's top-level
status; and the auto-renewal of a push consumer's messages. No sockets, no clocks."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import duration_pb2  # type: ignore[import-untyped]

from tidemq.protos.rocketmq import definition_pb2 as d
from tidemq.services.broker.rocketmq import receive_params as rules
from tidemq.services.broker.rocketmq.renewal import AutoRenewal, Due, renewal_due
from tidemq.services.broker.rocketmq.status import StatusError
from tidemq.services.errors import invalid
from tidemq.storage.clock import now_ms


def code_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(StatusError) as e:
        call()
    return str(d.Code.Name(e.value.code))


# ------------------------------------------------------------------ long poll
def test_long_poll_is_the_requested_time_when_the_deadline_leaves_room() -> None:
    # SimpleConsumer(await_duration=5): long_polling_timeout 5 s, deadline 3 + 5 s.
    assert rules.long_poll_ms(5_000, 7_900, 3_000) == 5_000


def test_long_poll_is_clamped_to_5_to_20_seconds() -> None:
    assert rules.long_poll_ms(1_000, None, None) == 5_000
    assert rules.long_poll_ms(0, None, None) == 5_000
    assert rules.long_poll_ms(60_000, None, None) == 20_000
    assert rules.long_poll_ms(60_000, 90_000, 3_000) == 20_000


def test_long_poll_always_ends_a_margin_before_the_calls_deadline() -> None:
    for requested in (1_000, 5_000, 20_000, None):
        for remaining in (1_001, 2_500, 4_000, 6_000, 21_000):
            poll = rules.long_poll_ms(requested, remaining, 3_000)
            assert 0 < poll <= remaining - rules.DEADLINE_MARGIN_MS


def test_long_poll_without_a_requested_time_takes_the_deadline_minus_half_the_request_timeout() -> (
    None
):
    assert rules.long_poll_ms(None, 16_000, 4_000) == 14_000
    assert rules.long_poll_ms(None, 13_000, None) == 11_500  # the clients' 3 s default
    assert rules.long_poll_ms(None, None, None) == rules.MAX_LONG_POLL_MS


def test_a_receive_whose_deadline_leaves_no_time_to_poll_is_refused_as_illegal_polling_time() -> (
    None
):
    assert code_of(lambda: rules.long_poll_ms(5_000, 900, 3_000)) == "ILLEGAL_POLLING_TIME"
    assert code_of(lambda: rules.long_poll_ms(5_000, 1_000, 3_000)) == "ILLEGAL_POLLING_TIME"
    assert code_of(lambda: rules.long_poll_ms(-1, None, None)) == "ILLEGAL_POLLING_TIME"


# ------------------------------------------------------------------ batch, invisible time
def test_batch_size_is_capped_at_32_and_must_be_positive() -> None:
    assert rules.batch_size(16) == 16
    assert rules.batch_size(1000) == 32
    assert code_of(lambda: rules.batch_size(0)) == "BAD_REQUEST"
    assert code_of(lambda: rules.batch_size(-3)) == "BAD_REQUEST"


def test_receive_invisible_time_must_be_within_the_brokers_bounds() -> None:
    assert rules.receive_invisible_ms(15_000, False, 1_000, 43_200_000) == 15_000
    assert code_of(lambda: rules.receive_invisible_ms(999, False, 1_000, 43_200_000)) == (
        "ILLEGAL_INVISIBLE_TIME"
    )
    assert code_of(lambda: rules.receive_invisible_ms(43_200_001, False, 1_000, 43_200_000)) == (
        "ILLEGAL_INVISIBLE_TIME"
    )
    assert code_of(lambda: rules.receive_invisible_ms(None, False, 1_000, 43_200_000)) == (
        "ILLEGAL_INVISIBLE_TIME"
    )


def test_an_auto_renew_receive_uses_60_seconds_whatever_it_asks() -> None:
    assert rules.receive_invisible_ms(None, True, 1_000, 43_200_000) == 60_000
    assert rules.receive_invisible_ms(5, True, 1_000, 43_200_000) == 60_000
    assert rules.receive_invisible_ms(None, True, 1_000, 30_000) == 30_000  # within the bounds


def test_a_change_below_the_floor_is_raised_to_it_and_above_the_ceiling_refused() -> None:
    assert rules.change_invisible_ms(0, 1_000, 43_200_000) == 1_000
    assert rules.change_invisible_ms(30_000, 1_000, 43_200_000) == 30_000
    assert code_of(lambda: rules.change_invisible_ms(43_200_001, 1_000, 43_200_000)) == (
        "ILLEGAL_INVISIBLE_TIME"
    )
    assert code_of(lambda: rules.change_invisible_ms(-1, 1_000, 43_200_000)) == (
        "ILLEGAL_INVISIBLE_TIME"
    )


def test_duration_ms_reads_seconds_and_nanos() -> None:
    assert rules.duration_ms(duration_pb2.Duration(seconds=15, nanos=500_000_000)) == 15_500


# ------------------------------------------------------------------ filters, broker
def test_tag_filters_pass_through_and_sql92_is_refused_clearly() -> None:
    tag = d.FilterExpression(type=d.TAG, expression="TagA || TagB")
    assert rules.tag_expression(tag, True) == "TagA || TagB"
    assert rules.tag_expression(d.FilterExpression(type=d.TAG), True) == "*"
    assert rules.tag_expression(d.FilterExpression(), False) == "*"
    sql = d.FilterExpression(type=d.SQL, expression="a > 1")
    with pytest.raises(StatusError) as e:
        rules.tag_expression(sql, True)
    assert e.value.code == d.ILLEGAL_FILTER_EXPRESSION
    assert "SQL92" in str(e.value) and "not supported" in str(e.value)


def test_a_receive_is_for_this_broker_group_or_names_none() -> None:
    assert rules.is_own_broker("broker-a", "broker-a")
    assert rules.is_own_broker("", "broker-a")
    assert not rules.is_own_broker("broker-b", "broker-a")


def test_the_ack_answer_is_ok_when_all_agree_else_multiple_results() -> None:
    assert rules.ack_status_code([d.OK, d.OK]) == d.OK
    assert rules.ack_status_code([d.INVALID_RECEIPT_HANDLE]) == d.INVALID_RECEIPT_HANDLE
    assert rules.ack_status_code([d.OK, d.INVALID_RECEIPT_HANDLE]) == d.MULTIPLE_RESULTS


# ------------------------------------------------------------------ auto-renewal
def test_renewal_is_due_ten_seconds_before_the_invisibility_ends() -> None:
    received = 1_000_000
    assert renewal_due(received + 60_000, received, received + 49_000) is Due.WAIT
    assert renewal_due(received + 60_000, received, received + 50_000) is Due.RENEW
    assert renewal_due(received + 60_000, received, received + 60_000) is Due.DROP


def test_renewal_stops_after_three_hours() -> None:
    received = 1_000_000
    late = received + 3 * 3_600_000
    assert renewal_due(late + 5_000, received, late - 1) is Due.RENEW
    assert renewal_due(late + 5_000, received, late) is Due.DROP


class FakeBroker:
    """The broker's change of invisible time: a new handle per change; ``gate`` holds it."""

    def __init__(self) -> None:
        self.changes: list[str] = []
        self.gate: asyncio.Event | None = None
        self.refuse = False

    async def change(self, group: str, topic: str, handle: str, ms: int) -> tuple[str, int]:
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse:
            raise invalid("handle expired")
        self.changes.append(handle)
        return f"{handle}+", now_ms() + ms


def test_a_due_message_is_renewed_and_its_original_handle_maps_to_the_new_one() -> None:
    async def run() -> None:
        broker = FakeBroker()
        renewal = AutoRenewal(broker.change, lambda cid: True, 60_000)
        soon = now_ms() + 5_000
        renewal.hold("c1", "g", "t", [("h1", soon), ("h2", soon + 600_000)])
        await renewal.renew_due(now_ms())
        assert broker.changes == ["h1"]
        assert await renewal.current("h1") == "h1+"
        assert await renewal.current("h2") == "h2"
        assert await renewal.current("unknown") == "unknown"
        renewal.forget("h1")
        assert await renewal.current("h1") == "h1"
        await renewal.close()

    asyncio.run(run())


def test_a_settle_during_a_renewal_waits_for_it_and_uses_the_new_handle() -> None:
    async def run() -> None:
        broker = FakeBroker()
        broker.gate = asyncio.Event()
        renewal = AutoRenewal(broker.change, lambda cid: True, 60_000)
        renewal.hold("c1", "g", "t", [("h1", now_ms() + 1_000)])
        renewing = asyncio.create_task(renewal.renew_due(now_ms()))
        await asyncio.sleep(0)
        looking = asyncio.create_task(renewal.current("h1"))
        await asyncio.sleep(0)
        assert not looking.done()
        broker.gate.set()
        await renewing
        assert await looking == "h1+"
        await renewal.close()

    asyncio.run(run())


def test_renewal_stops_for_a_gone_client_and_for_a_refused_handle() -> None:
    async def run() -> None:
        broker = FakeBroker()
        known = {"c1"}
        renewal = AutoRenewal(broker.change, lambda cid: cid in known, 60_000)
        soon = now_ms() + 5_000
        renewal.hold("c1", "g", "t", [("h1", soon)])
        renewal.hold("c2", "g", "t", [("h2", soon)])
        broker.refuse = True
        await renewal.renew_due(now_ms())
        assert len(renewal) == 0  # c2 unknown: dropped; h1 refused: dropped
        assert broker.changes == []
        await renewal.close()

    asyncio.run(run())
