"""The slave's state machine, scripted: answers to its handshake, chunks, reports, silence."""

from __future__ import annotations

import pytest

from tidemq.replication.slave import (
    ProtocolError,
    ReconnectBackoff,
    ResyncFrom,
    SlaveSession,
    TruncateTo,
)

pytestmark = pytest.mark.unit

FILE = 1000


def session() -> SlaveSession:
    return SlaveSession(FILE, report_interval_ms=5000, idle_timeout_ms=20000, now_ms=0)


def test_continue_then_chunks_in_order_and_reports() -> None:
    s = session()
    assert (
        s.on_accepted(550, False, "", 2000, local_empty=False, local_max_offset=550, now_ms=1)
        is None
    )
    assert s.report_due(550, 1)
    s.on_reported(550, 1)
    assert not s.report_due(550, 2)
    s.on_chunk(550, 450, 3)
    s.on_appended(1000)
    assert s.report_due(1000, 3)  # after every chunk
    s.on_reported(1000, 3)
    assert s.report_due(1000, 5003)  # and at least every interval
    assert s.lag_bytes() == 1000


@pytest.mark.parametrize(
    ("offset", "length", "needle"),
    [(600, 10, "log ends at 550"), (550, 0, "empty chunk"), (550, 451, "spans two")],
)
def test_bad_chunks_end_the_link(offset: int, length: int, needle: str) -> None:
    s = session()
    s.on_accepted(550, False, "", 2000, local_empty=False, local_max_offset=550, now_ms=0)
    with pytest.raises(ProtocolError, match=needle):
        s.on_chunk(offset, length, 0)


def test_chunk_before_the_answer_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="before the handshake"):
        session().on_chunk(0, 10, 0)


def test_told_to_truncate_cuts_back_first() -> None:
    s = session()
    cut = s.on_accepted(
        300, True, "diverged", 900, local_empty=False, local_max_offset=700, now_ms=0
    )
    assert cut == TruncateTo(300, "diverged")
    assert s.expected_offset == 300


@pytest.mark.parametrize(
    ("start", "truncate", "empty", "local_max", "needle"),
    [
        (400, False, False, 550, "continue at 400"),
        (800, True, False, 550, "cut back to 800"),
        (0, True, True, 0, "cut back to 0"),
        (1500, False, True, 0, "inside a file"),
        (1500, False, False, 550, "inside a file"),
        (3000, False, True, 0, "outside the master's log"),
    ],
)
def test_answers_that_do_not_fit_the_local_log_are_refused(
    start: int, truncate: bool, empty: bool, local_max: int, needle: str
) -> None:
    with pytest.raises(ProtocolError, match=needle):
        session().on_accepted(start, truncate, "", 2000, empty, local_max, 0)


def test_an_empty_log_starts_at_any_file_boundary() -> None:
    s = session()
    assert (
        s.on_accepted(2000, False, "", 2500, local_empty=True, local_max_offset=0, now_ms=0) is None
    )
    s.on_chunk(2000, 500, 1)


def test_a_start_past_the_local_end_sets_the_store_aside_and_starts_there() -> None:
    s = session()
    action = s.on_accepted(
        2000, False, "behind", 2500, local_empty=False, local_max_offset=550, now_ms=0
    )
    assert action == ResyncFrom(2000, "behind")
    assert s.expected_offset == 2000
    s.on_chunk(2000, 500, 1)


def test_silence_and_the_next_deadline() -> None:
    s = session()
    s.on_accepted(0, False, "", 0, local_empty=True, local_max_offset=0, now_ms=0)
    s.on_reported(0, 0)
    assert s.next_deadline_ms() == 5000
    s.on_heartbeat(10, 4000)
    assert not s.silent(23999)
    assert s.silent(24000)


def sync_session() -> SlaveSession:
    s = SlaveSession(
        FILE,
        report_interval_ms=5000,
        idle_timeout_ms=20000,
        now_ms=0,
        flush_sync=True,
        max_unflushed_bytes=300,
    )
    s.on_accepted(100, False, "", 2000, local_empty=False, local_max_offset=100, now_ms=0)
    s.on_flushed(100)
    return s


def test_async_slave_flush_acknowledges_what_is_appended() -> None:
    s = session()
    s.on_accepted(100, False, "", 2000, local_empty=False, local_max_offset=100, now_ms=0)
    s.on_chunk(100, 50, 1)
    s.on_appended(150)
    assert not s.flush_due(more_waiting=False)
    assert s.ack_offset() == 150


def test_sync_slave_flush_acknowledges_only_what_is_flushed() -> None:
    s = sync_session()
    s.on_chunk(100, 50, 1)
    s.on_appended(150)
    assert s.ack_offset() == 100  # appended, not yet durable: not acknowledged
    assert s.flush_due(more_waiting=False)
    s.on_flushed(150)
    assert s.ack_offset() == 150
    assert not s.flush_due(more_waiting=False)


def test_sync_slave_flush_groups_a_burst_of_chunks_up_to_the_cap() -> None:
    s = sync_session()
    for start in (100, 150, 200):
        s.on_chunk(start, 50, 1)
        s.on_appended(start + 50)
        assert not s.flush_due(more_waiting=True)  # more chunks waiting join this flush
    s.on_chunk(250, 200, 1)
    s.on_appended(450)
    assert s.flush_due(more_waiting=True)  # 350 unflushed bytes reached the cap of 300
    s.on_flushed(450)
    assert s.ack_offset() == 450


def test_reconnect_waits_grow_then_start_again_short_for_a_new_master() -> None:
    """A failover: the old master refused five attempts (waits grown to its cap); the
    registry names the new master, whose first answer is still "not the master now"; the next
    attempt comes after the shortest wait, not after the old master's longest."""
    b = ReconnectBackoff(0.2, 5.0)
    assert [b.wait(n) for n in range(1, 7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    b.master_changed()
    assert [b.wait(n) for n in range(7, 10)] == [0.2, 0.4, 0.8]


def test_a_new_series_of_attempts_starts_from_the_shortest_wait() -> None:
    b = ReconnectBackoff(0.2, 5.0)
    assert [b.wait(n) for n in range(1, 5)] == [0.2, 0.4, 0.8, 1.6]
    # The link was healthy for a while, then ended: tenacity numbers from 1 again.
    assert [b.wait(n) for n in range(1, 3)] == [0.2, 0.4]


def test_a_slave_warms_its_store_only_while_it_is_catching_up() -> None:
    s = session()
    s.on_accepted(0, False, "", 900, local_empty=True, local_max_offset=0, now_ms=1)
    assert s.catch_up_warming(500) == 500  # 900 behind: catching up
    assert s.catch_up_warming(0) == 0  # turned off
    s.on_chunk(0, 450, 2)
    s.on_appended(450)
    assert s.catch_up_warming(500) == 0  # 450 behind: in step
    s.on_heartbeat(2_000, 3)  # the master moved on by more than the threshold
    assert s.catch_up_warming(500) == 500
