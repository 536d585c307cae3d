"""The replica floor the master's retention keeps to: which slaves count, from the tracker."""

from __future__ import annotations

import pytest

from tidemq.replication import Accept, MasterTracker, ReplicationConfig
from tidemq.replication.retention_floor import replica_floor

pytestmark = pytest.mark.unit

CFG = ReplicationConfig(insync_max_lag_bytes=1000)


def tracker_with(acks: dict[int, int]) -> MasterTracker:
    t = MasterTracker(CFG, 100)
    for broker_id, offset in acks.items():
        t.connect(broker_id, Accept(offset, False, "", 0, offset), 0)
    return t


def test_no_slave_heard_from_holds_nothing_back() -> None:
    assert replica_floor(MasterTracker(CFG, 100), 5000, 0) is None


def test_the_slowest_in_sync_slave_sets_the_floor_even_after_its_link_is_gone() -> None:
    t = tracker_with({1: 4500, 2: 4200})
    for link in list(t.links):
        t.disconnect(link)  # stopped slaves: what they acknowledged still counts
    assert replica_floor(t, 5000, 0) == 4200


def test_a_slave_beyond_the_in_sync_bound_no_longer_holds_retention_back() -> None:
    t = tracker_with({1: 4500, 2: 3000})
    assert replica_floor(t, 5000, 0) == 4500
    assert replica_floor(tracker_with({2: 3000}), 5000, 0) is None


def test_under_automatic_failover_isr_slaves_count_an_unheard_one_at_the_confirm() -> None:
    t = tracker_with({1: 100, 2: 4800})
    t.isr, t.master_id = frozenset({0, 1, 3}), 0  # 2 left the ISR, 3 not heard from yet
    assert replica_floor(t, 5000, 2500) == 100
    t.isr = frozenset({0, 3})
    assert replica_floor(t, 5000, 2500) == 2500
    t.isr = frozenset({0})
    assert replica_floor(t, 5000, 2500) is None
