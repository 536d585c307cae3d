"""Automatic failover decisions scripted without ZooKeeper, sockets or clocks: who may take
over, who should, how the ISR moves, and what the SYNC acknowledgement counts as held."""

from __future__ import annotations

from tidemq.replication.config import ReplicationConfig
from tidemq.replication.election import (
    Candidate,
    Elected,
    GroupState,
    NoneEligible,
    ReplicaView,
    choose_master,
    confirmed_by_isr,
    isr_after,
    should_elect_self,
)
from tidemq.replication.handshake import Accept
from tidemq.replication.master import MasterTracker


def state(epoch: int, master: int, *isr: int, preferred: int | None = None) -> GroupState:
    return GroupState(epoch, master, frozenset({master, *isr}), preferred)


def test_first_election_takes_the_best_live_broker_at_epoch_one() -> None:
    got = choose_master(None, [Candidate(2, 0, 0, priority=1), Candidate(3, 0, 0, priority=0)])
    assert got == Elected(3, GroupState(1, 3, frozenset({3})))


def test_only_isr_members_are_eligible_and_rank_by_epoch_then_offset_then_priority() -> None:
    s = state(4, 1, 2, 3)
    live = [
        Candidate(2, last_epoch=4, max_offset=900),
        Candidate(3, last_epoch=4, max_offset=1000),
        Candidate(5, last_epoch=4, max_offset=5000),  # ahead, but not in the ISR
    ]
    got = choose_master(s, live)
    assert isinstance(got, Elected)
    assert got.winner == 3 and got.state == GroupState(5, 3, frozenset({3}))
    # A newer epoch beats a longer log: the longer one holds an older master's tail.
    got = choose_master(s, [Candidate(2, 4, 900), Candidate(3, 3, 5000)])
    assert isinstance(got, Elected) and got.winner == 2
    # Equal logs: the lower priority number, then the lower id.
    got = choose_master(s, [Candidate(2, 4, 900, priority=5), Candidate(3, 4, 900, priority=1)])
    assert isinstance(got, Elected) and got.winner == 3
    got = choose_master(s, [Candidate(3, 4, 900), Candidate(2, 4, 900)])
    assert isinstance(got, Elected) and got.winner == 2


def test_no_eligible_replica_leaves_the_group_masterless_unless_unclean_is_allowed() -> None:
    s = state(4, 1, 2)
    got = choose_master(s, [Candidate(5, 3, 100)])
    assert isinstance(got, NoneEligible) and "unclean election is off" in got.reason
    unclean = choose_master(s, [Candidate(5, 3, 100)], unclean=True)
    assert isinstance(unclean, Elected) and unclean.winner == 5 and unclean.state.epoch == 5


def test_a_switchover_target_takes_over_at_once_and_the_others_wait_for_it() -> None:
    s = state(7, 1, 2, 3, preferred=2)
    live = [Candidate(2, 7, 100), Candidate(3, 7, 100)]
    assert should_elect_self(3, s, live, False, master_gone_for_ms=10_000, settle_ms=500) is None
    got = should_elect_self(2, s, live, False, master_gone_for_ms=0, settle_ms=500)
    assert got is not None and got.state == GroupState(8, 2, frozenset({2}))


def test_the_best_ranked_broker_waits_out_the_settle_time_before_taking_over() -> None:
    s = state(2, 1, 2, 3)
    live = [Candidate(2, 2, 500), Candidate(3, 2, 400)]
    assert should_elect_self(2, s, live, False, master_gone_for_ms=100, settle_ms=500) is None
    assert should_elect_self(3, s, live, False, master_gone_for_ms=900, settle_ms=500) is None
    got = should_elect_self(2, s, live, False, master_gone_for_ms=600, settle_ms=500)
    assert got is not None and got.winner == 2


def view(b: int, linked: bool, acked: int, caught_up_ms: int | None) -> ReplicaView:
    return ReplicaView(b, linked, acked, caught_up_ms)


def test_a_lagging_or_unlinked_member_leaves_the_isr_and_a_caught_up_slave_joins() -> None:
    s = state(3, 1, 2, 3)
    replicas = {
        2: view(2, True, 1000, caught_up_ms=1_000),  # behind for 16 s
        3: view(3, False, 1000, caught_up_ms=16_500),  # no link
        4: view(4, True, 1000, caught_up_ms=16_900),  # caught up within this epoch
        5: view(5, True, 100, caught_up_ms=16_900),  # holds nothing of this epoch yet
    }
    got = isr_after(s, replicas, 500, 17_000, max_lag_ms=15_000, join_window_ms=15_000)
    assert got == frozenset({1, 4})
    # Nothing changes for members that keep up.
    keep = {2: view(2, True, 1000, 16_000), 3: view(3, True, 1000, 16_000)}
    assert isr_after(s, keep, 500, 17_000, 15_000, 15_000) == s.isr


def test_sync_acknowledgement_counts_every_isr_slave() -> None:
    assert confirmed_by_isr(1, {1, 2, 3}, {2: 700, 3: 500}, 900) == 500
    assert confirmed_by_isr(1, {1, 2, 3}, {2: 700}, 900) == 0  # 3 has not reported
    assert confirmed_by_isr(1, {1}, {}, 900) == 900  # alone: its own log


def test_a_tracker_under_an_isr_waits_for_every_member_and_not_for_outsiders() -> None:
    t = MasterTracker(ReplicationConfig(chunk_bytes=4096), 1 << 20)
    t.isr, t.master_id = frozenset({1, 2, 3}), 1
    a = t.connect(2, Accept(0, False, "", 0, 1000), now_ms=0)
    b = t.connect(3, Accept(0, False, "", 0, 1000), now_ms=0)
    c = t.connect(4, Accept(0, False, "", 0, 1000), now_ms=0)  # not in the ISR
    for link in (a, b, c):
        t.on_sent(link.link_id, 0, 1000, now_ms=1, master_max_offset=1000)
    t.on_report(a.link_id, 1000, now_ms=2, master_max_offset=1000)
    t.on_report(c.link_id, 1000, now_ms=2, master_max_offset=1000)
    assert t.confirmed_offset(1000) == 0  # member 3 holds nothing yet
    t.on_report(b.link_id, 600, now_ms=3, master_max_offset=1000)
    assert t.confirmed_offset(1000) == 600
    assert t.replica_views()[2] == ReplicaView(2, True, 1000, 2)
    assert t.replica_views()[3].caught_up_ms is None  # 600 of the 1000 sent
    # Member 3 disconnects: it still holds what it acknowledged, and still pins the offset.
    t.disconnect(b.link_id)
    assert t.confirmed_offset(1000) == 600
    assert t.replica_views()[3] == ReplicaView(3, False, 600, None)
    t.isr = frozenset({1, 2})  # the master wrote it out of the ISR
    assert t.confirmed_offset(1000) == 1000
    t.isr = frozenset({1})
    assert not t.quorum_available(1000) and t.confirmed_offset(1000) is None
