"""SYNC_MASTER acknowledgement scripted without sockets or clocks: which slaves count (in sync),
what a quorum of them holds (the confirmed offset), and how waiting sends are released."""

from __future__ import annotations

import pytest

from tidemq.replication.acks import GroupAck, quorum_offset
from tidemq.replication.config import ReplicationConfig
from tidemq.replication.handshake import Accept
from tidemq.replication.master import MasterTracker

FILE = 1 << 20


def tracker(min_insync: int = 1, max_lag: int = 1000) -> MasterTracker:
    cfg = ReplicationConfig(
        chunk_bytes=4096,
        max_in_flight_bytes=1 << 20,
        min_insync_replicas=min_insync,
        insync_max_lag_bytes=max_lag,
    )
    return MasterTracker(cfg, FILE)


def slave_at(t: MasterTracker, broker_id: int, acked: int, sent: int | None = None) -> int:
    """A slave link that has acknowledged ``acked`` (and was sent ``sent``)."""
    link = t.connect(broker_id, Accept(0, False, "", 0, 0), now_ms=0, address=f"s{broker_id}")
    t.on_sent(link.link_id, 0, sent if sent is not None else acked, 0)
    t.on_report(link.link_id, acked, 1, last_store_timestamp_ms=1_000)
    return link.link_id


def test_group_ack_releases_every_waiter_a_confirmed_offset_covers_in_order() -> None:
    acks: GroupAck[str] = GroupAck()
    for end, name in [(300, "c"), (100, "a"), (200, "b"), (200, "b2"), (900, "z")]:
        acks.add(end, name)
    assert acks.release(99) == []
    assert acks.release(250) == ["a", "b", "b2"]  # one report acknowledges many sends
    assert len(acks) == 2
    assert acks.release(250) == []
    assert acks.drain() == ["c", "z"]
    assert len(acks) == 0


@pytest.mark.parametrize(
    ("acked", "quorum", "want"),
    [([], 1, None), ([5], 1, 5), ([5, 9, 7], 1, 9), ([5, 9, 7], 2, 7), ([5, 9, 7], 3, 5)],
)
def test_quorum_offset_is_what_at_least_quorum_replicas_hold(
    acked: list[int], quorum: int, want: int | None
) -> None:
    assert quorum_offset(acked, quorum) == want


def test_quorum_offset_refuses_a_nonsense_quorum() -> None:
    with pytest.raises(ValueError, match="quorum"):
        quorum_offset([1], 0)


def test_a_slave_too_far_behind_is_out_of_sync_and_confirms_nothing() -> None:
    t = tracker(max_lag=1000)
    slave_at(t, 1, acked=4000)
    assert t.quorum_available(5000)  # exactly 1000 behind: still in sync
    assert t.confirmed_offset(5000) == 4000
    assert not t.quorum_available(5001)
    assert t.confirmed_offset(5001) is None
    (lag,) = t.lags(5001, 2_500)
    assert (lag.broker_id, lag.address, lag.lag_bytes, lag.in_sync) == (1, "s1", 1001, False)
    assert lag.lag_seconds == 1.5  # store time of the master's newest record minus the slave's


def test_two_replicas_need_two_slaves_in_sync() -> None:
    t = tracker(min_insync=2)
    slave_at(t, 1, acked=900)
    assert not t.quorum_available(1000)
    slave_at(t, 2, acked=700)
    assert t.quorum_available(1000)
    assert t.confirmed_offset(1000) == 700  # the slower of the two holds everything below 700


def test_a_caught_up_slave_has_no_lag_and_a_broken_link_does_not_count() -> None:
    t = tracker()
    link = slave_at(t, 1, acked=500)
    assert t.lags(500, 9_999)[0].lag_seconds == 0.0
    t.on_report(link, 700, 2)  # beyond the 500 sent: a protocol error, not an ack
    assert not t.quorum_available(500)
    assert t.confirmed_offset(500) is None


def test_lag_in_seconds_is_unknown_until_the_slave_has_a_record() -> None:
    t = tracker()
    link = t.connect(1, Accept(0, False, "", 0, 0), now_ms=0).link_id
    t.on_sent(link, 0, 100, 0)
    t.on_report(link, 100, 1)
    assert t.lags(200, 5_000)[0].lag_seconds == -1.0


def test_replaced_link_counts_once() -> None:
    t = tracker(min_insync=2)
    slave_at(t, 1, acked=900)
    slave_at(t, 1, acked=900)  # the same slave reconnecting
    assert not t.quorum_available(1000)
