"""QueueInFlight: every transition of one receive group's state on one queue, with no clock
and no store (the tests pass now_ms and read messages from a list)."""

import pytest

from tests.unit.receive_sim import KEY, Driver
from tidemq.services.broker.receive.events import Acked, Changed, Dead, Init, Received, Reset
from tidemq.services.broker.receive.queue_state import (
    MAX_SCAN_PER_PLAN,
    HandleStatus,
    QueueInFlight,
)
from tidemq.services.broker.receive.retry_policy import RetryPolicy

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000
A, B, C = 111, 222, 333  # message group hashes


def started(count: int = 10, start: int = 0, **kwargs: object) -> Driver:
    d = Driver(**kwargs)  # type: ignore[arg-type]
    d.log.add(count)
    d.append(Init(KEY, start))
    return d


def test_a_new_queue_delivers_from_its_start_offset_in_order_with_attempt_one() -> None:
    d = started(10, start=3)
    assert (d.q.floor, d.q.cursor) == (3, 3)
    lease, delivered = d.receive(T0, n=4)
    assert delivered == [(3, 1, 0, "m3"), (4, 1, 0, "m4"), (5, 1, 0, "m5"), (6, 1, 0, "m6")]
    assert (d.q.floor, d.q.cursor) == (3, 7)
    assert d.q.check(4, lease, T0 + 29_999) is HandleStatus.OK
    assert d.q.attempt(4) == 1
    assert d.q.lease_id(4) == lease


def test_an_invisible_message_is_not_delivered_again_while_its_lease_lasts() -> None:
    d = started(5)
    first = d.offsets(T0, n=3)
    second = d.offsets(T0 + 1, n=10)
    assert (first, second) == ([0, 1, 2], [3, 4])
    assert d.receive(T0 + 29_999) == (0, [])
    assert d.plan(T0 + 29_999) is None


def test_ack_completes_and_the_floor_passes_done_offsets_only_up_to_the_lowest_open() -> None:
    d = started(5)
    lease, _ = d.receive(T0, n=5)
    d.append(Acked(KEY, ((1, lease), (2, lease))))
    assert (d.q.floor, d.q.cursor, len(d.q)) == (0, 5, 3)
    assert d.q.check(2, lease, T0) is HandleStatus.ACKED
    d.append(Acked(KEY, ((0, lease),)))
    assert d.q.floor == 3
    assert d.q.check(0, lease, T0) is HandleStatus.ACKED  # below the floor: done
    d.append(Acked(KEY, ((3, lease), (4, lease))))
    assert (d.q.floor, len(d.q)) == (5, 0)
    assert d.plan(T0 + 10**9) is None  # acked messages never come back


def test_an_expired_lease_redelivers_with_attempt_two_and_supersedes_the_old_handle() -> None:
    d = started(1)
    old, _ = d.receive(T0, invisible_ms=5_000)
    assert d.q.check(0, old, T0 + 5_000) is HandleStatus.EXPIRED
    assert d.offsets(T0 + 4_999) == []
    new, delivered = d.receive(T0 + 5_000)
    assert delivered == [(0, 2, 0, None)]  # a retry: the service reads the message by offset
    assert d.q.check(0, old, T0 + 5_001) is HandleStatus.SUPERSEDED
    assert d.q.check(0, new, T0 + 5_001) is HandleStatus.OK
    d.append(Acked(KEY, ((0, old),)))  # the stale ack lost the race: ignored
    assert d.q.is_open(0)
    d.append(Acked(KEY, ((0, new),)))
    assert not d.q.is_open(0)


def test_after_a_short_lease_the_retry_delay_decides_when_the_message_is_visible() -> None:
    d = started(1, policy=RetryPolicy(delays_ms=(10_000,)))
    d.receive(T0, invisible_ms=1_000)
    assert d.q.visible_at_ms(0) == T0 + 1_000
    assert d.q.visible_at_ms(0, d.policy) == T0 + 10_000
    assert d.offsets(T0 + 9_999) == []
    assert d.q.next_visible_ms(T0 + 1_500, d.policy) == T0 + 10_000
    assert d.offsets(T0 + 10_000) == [0]


def test_nack_releases_at_its_own_visible_time_and_the_holders_handle_is_stale() -> None:
    d = started(2)
    lease, _ = d.receive(T0)
    nack = d.append(Changed(KEY, T0 + 10, ((0, lease, T0 + 2_000),), released=True))
    assert d.q.check(0, lease, T0 + 11) is HandleStatus.SUPERSEDED
    assert d.q.check(0, nack, T0 + 11) is HandleStatus.UNKNOWN  # a nack leases to nobody
    assert d.q.visible_at_ms(0) == T0 + 2_000
    assert d.offsets(T0 + 1_999) == []
    assert d.receive(T0 + 2_000)[1] == [(0, 2, 0, None)]
    assert d.q.counts(T0 + 2_001, d.policy) == (2, 0, 0)


def test_change_invisible_duration_renews_under_a_new_lease() -> None:
    d = started(1)
    lease, _ = d.receive(T0, invisible_ms=1_000)
    renewed = d.append(Changed(KEY, T0 + 500, ((0, lease, T0 + 60_000),), released=False))
    assert d.q.check(0, lease, T0 + 600) is HandleStatus.SUPERSEDED
    assert d.q.check(0, renewed, T0 + 59_999) is HandleStatus.OK
    assert d.offsets(T0 + 59_999) == []  # past the first deadline: still invisible
    assert d.q.check(0, renewed, T0 + 60_000) is HandleStatus.EXPIRED
    assert d.q.attempt(0) == 1  # a renewal is not a delivery


def test_changed_and_acked_with_a_lease_that_no_longer_matches_change_nothing() -> None:
    d = started(2)
    lease, _ = d.receive(T0)
    before = d.q.state()
    d.append(Changed(KEY, T0, ((0, lease - 1, T0 + 5),), released=True))
    d.append(Acked(KEY, ((1, lease + 100),)))
    d.append(Dead(KEY, ((1, 7),)))
    d.append(Acked(KEY, ((99, lease),)))
    assert d.q.state() == before


def test_filtered_messages_are_done_and_never_delivered() -> None:
    d = Driver()
    d.log.add(2, matches=False)
    d.log.add(1)
    d.log.add(2, matches=False)
    d.append(Init(KEY, 0))
    plan = d.plan(T0)
    assert plan is not None
    assert (plan.filtered, [o for o, *_ in plan.delivered], plan.cursor) == ((0, 1, 3, 4), [2], 5)
    lease = d.append(plan.event(KEY, T0, T0 + 1_000))
    assert (d.q.floor, d.q.cursor, len(d.q)) == (2, 5, 1)
    d.append(Acked(KEY, ((2, lease),)))
    assert d.q.floor == 5
    assert d.q.check(3, lease, T0) is HandleStatus.ACKED


def test_a_backlog_of_filtered_messages_is_walked_in_bounded_steps() -> None:
    d = Driver()
    d.log.add(MAX_SCAN_PER_PLAN + 10, matches=False)
    d.log.add(1)
    d.append(Init(KEY, 0))
    plan = d.plan(T0)
    assert plan is not None
    assert (len(plan.filtered), plan.delivered) == (MAX_SCAN_PER_PLAN, [])
    d.append(plan.event(KEY, T0, T0))
    assert d.offsets(T0) == [MAX_SCAN_PER_PLAN + 10]
    assert d.q.floor == MAX_SCAN_PER_PLAN + 10


def test_messages_out_of_attempts_are_not_delivered_but_offered_for_dead_lettering() -> None:
    d = started(2, max_attempts=2)
    assert d.offsets(T0, invisible_ms=1_000) == [0, 1]
    assert d.offsets(T0 + 100_000, invisible_ms=1_000) == [0, 1]
    # both are on their second (last) delivery; one is nacked, one's lease runs out
    lease = d.q.lease_id(0)
    assert lease is not None
    nack = d.append(Changed(KEY, T0 + 100_010, ((0, lease, T0 + 100_020),), released=True))
    assert d.q.dead_candidates(T0 + 100_011, 2, d.policy) == [(0, nack)]
    assert d.offsets(T0 + 10**7) == []
    assert d.q.next_visible_ms(T0 + 10**7, d.policy, max_attempts=2) is None
    both = d.q.dead_candidates(T0 + 10**7, 2, d.policy)
    assert both == [(0, nack), (1, d.q.lease_id(1))]
    d.append(Dead(KEY, tuple(both)))
    assert (d.q.floor, len(d.q)) == (2, 0)
    assert d.q.check(1, both[1][1], T0 + 10**7) is HandleStatus.ACKED


def test_dead_candidates_leave_out_messages_someone_still_holds() -> None:
    d = started(1, max_attempts=1)
    d.receive(T0, invisible_ms=1_000)
    assert d.q.dead_candidates(T0 + 999, 1, d.policy) == []
    assert d.q.dead_candidates(T0 + 1_000, 1, d.policy) == [(0, d.q.lease_id(0))]


def test_counts_and_next_visible_time() -> None:
    d = started(4)
    lease, _ = d.receive(T0, n=3, invisible_ms=5_000)
    d.append(Changed(KEY, T0 + 1, ((2, lease, T0 + 3_000),), released=True))
    assert d.q.counts(T0 + 2, d.policy) == (2, 1, 0)
    assert d.q.next_visible_ms(T0 + 2, d.policy) == T0 + 3_000
    assert d.q.counts(T0 + 5_000, d.policy) == (0, 3, 0)
    assert d.q.next_visible_ms(T0 + 5_000, d.policy) is None  # all deliverable now


def test_reset_forgets_everything_and_starts_at_the_offset() -> None:
    d = started(10)
    lease, _ = d.receive(T0, n=5)
    d.append(Reset(KEY, 8))
    assert (d.q.floor, d.q.cursor, len(d.q)) == (8, 8, 0)
    assert d.q.check(2, lease, T0) is HandleStatus.ACKED
    assert d.offsets(T0) == [8, 9]
    d.append(Reset(KEY, 1))  # backwards too: an operator replays
    assert d.offsets(T0, n=3) == [1, 2, 3]


def test_handles_beyond_the_cursor_or_with_a_future_lease_are_unknown() -> None:
    d = started(3)
    lease, _ = d.receive(T0, n=2)
    assert d.q.check(2, lease, T0) is HandleStatus.UNKNOWN
    assert d.q.check(0, lease + 1, T0) is HandleStatus.UNKNOWN


def test_a_retry_of_an_offset_acked_meanwhile_is_ignored_on_replay() -> None:
    q = QueueInFlight(0)
    q.apply(Received(KEY, T0, T0 + 10, ((0, 1, 0), (1, 1, 0)), (), (), 2), 100)
    q.apply(Acked(KEY, ((1, 100),)), 200)
    q.apply(Received(KEY, T0 + 20, T0 + 30, ((0, 2, 0), (1, 2, 0)), (), (), 2), 300)
    assert q.state() == (0, 2, [(0, (1, 2, 0, 300, T0 + 20, T0 + 30))])


def test_one_batch_shares_one_state_record() -> None:
    d = started(32)
    d.receive(T0, n=32)
    slots = {id(s) for _, s in d.q.items()}
    assert len(slots) == 1


# ---- FIFO message groups ----


def fifo_driver(groups: list[int], **kwargs: object) -> Driver:
    d = Driver(fifo=True, **kwargs)  # type: ignore[arg-type]
    for g in groups:
        d.log.add(group=g)
    d.append(Init(KEY, 0))
    return d


def test_fifo_holds_a_groups_later_messages_while_its_first_is_in_flight() -> None:
    d = fifo_driver([A, A, B, A, B, 0, 0])
    lease, delivered = d.receive(T0)
    assert [o for o, *_ in delivered] == [0, 2, 5, 6]
    assert d.q.counts(T0, d.policy) == (4, 0, 3)
    assert d.offsets(T0 + 1) == []
    d.append(Acked(KEY, ((0, lease),)))
    assert d.receive(T0 + 2)[1] == [(1, 1, A, None)]  # held: the service reads it
    d.append(Acked(KEY, ((2, lease),)))
    assert d.offsets(T0 + 3) == [4]
    assert d.q.counts(T0 + 3, d.policy) == (4, 0, 1)


def test_fifo_retries_in_place_nothing_of_the_group_overtakes_a_nacked_message() -> None:
    d = fifo_driver([A, A, B])
    lease, _ = d.receive(T0)
    d.append(Changed(KEY, T0 + 1, ((0, lease, T0 + 1_000),), released=True))
    assert d.offsets(T0 + 2) == []
    assert d.receive(T0 + 1_000)[1] == [(0, 2, A, None)]
    d.receive(T0 + 40_000)  # the lease expired too: third delivery, A1 still behind it
    assert d.q.attempt(0) == 3 and d.q.attempt(1) == 0
    d.append(Acked(KEY, ((0, d.q.lease_id(0) or 0),)))
    assert d.offsets(T0 + 40_001) == [1]


def test_fifo_dead_lettering_the_head_unblocks_its_group() -> None:
    d = fifo_driver([A, A], max_attempts=1)
    d.receive(T0, invisible_ms=1_000)
    assert d.offsets(T0 + 5_000) == []
    d.append(Dead(KEY, tuple(d.q.dead_candidates(T0 + 5_000, 1, d.policy))))
    assert d.offsets(T0 + 5_001) == [1]


def test_fifo_window_a_stuck_group_holds_back_at_most_max_held_messages() -> None:
    d = fifo_driver([A] * 5 + [B, C], max_held=3)
    assert d.offsets(T0) == [0]  # A1..A3 held; no room for A4: B and C wait behind it
    assert d.q.cursor == 4
    assert d.q.counts(T0, d.policy) == (1, 0, 3)
    assert d.offsets(T0 + 1) == []
    lease = d.q.lease_id(0)
    d.append(Acked(KEY, ((0, lease or 0),)))
    assert d.offsets(T0 + 2) == [1, 5, 6]  # A1 leaves the window, A4 takes its place
    assert d.q.counts(T0 + 2, d.policy) == (3, 0, 3)


def test_fifo_window_counts_only_held_messages_other_groups_pass_a_full_window() -> None:
    d = fifo_driver([A, A, B, C, A], max_held=1)
    assert d.offsets(T0) == [0, 2, 3]  # A1 fills the window; B and C are not held
    assert d.q.cursor == 4  # A (offset 4) would need a second held slot


def test_a_queue_switched_from_fifo_to_plain_delivers_its_held_messages() -> None:
    d = fifo_driver([A, A, A])
    d.receive(T0)
    d.fifo = False
    assert d.offsets(T0 + 1) == [1, 2]
    assert d.q.counts(T0 + 1, d.policy) == (3, 0, 0)


def test_plan_refuses_a_receive_of_nothing() -> None:
    d = started(1)
    with pytest.raises(ValueError, match="max_messages"):
        d.plan(T0, n=0)


def test_a_queue_switched_to_fifo_redelivers_only_each_groups_first_message() -> None:
    d = fifo_driver([A, A, B])
    d.fifo = False
    lease, _ = d.receive(T0, invisible_ms=1_000)  # plain: both of A in flight at once
    d.fifo = True
    assert d.receive(T0 + 5_000)[1] == [(0, 2, A, None), (2, 2, B, None)]
    assert d.offsets(T0 + 5_001) == []  # A1 waits behind A0 although its lease ended
    d.append(Acked(KEY, ((0, d.q.lease_id(0) or 0),)))
    assert d.receive(T0 + 5_002)[1] == [(1, 2, A, None)]
    assert lease < (d.q.lease_id(1) or 0)
