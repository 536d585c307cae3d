"""ReceiveStates: all queues, the snapshot codec, and property-style checks of the whole core
on random histories (random.Random(seed)): replay equals live, snapshots round-trip, no offset
is handed out twice while a lease lasts, FIFO groups stay ordered and independent."""

import gc
import random
import struct
import tracemalloc
import zlib

import pytest

from tests.unit.receive_sim import (
    KEY,
    Driver,
    walk_dead,
    walk_fifo_retries,
    walk_next_visible,
    walk_retries,
)
from tidemq.services.broker.receive.events import (
    Acked,
    Changed,
    Dead,
    Event,
    Init,
    QueueKey,
    Received,
    Reset,
)
from tidemq.services.broker.receive.queue_state import HandleStatus
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.receive.states import (
    ReceiveStates,
    SnapshotFormatError,
    measure_bytes_per_entry,
)

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000
K0, K1 = QueueKey("g", "t", 0), QueueKey("g", "t", 1)


def small_states() -> ReceiveStates:
    s = ReceiveStates()
    s.apply(Init(K1, 10), 100)
    s.apply(Received(K1, 1000, 2000, ((10, 1, 0), (11, 1, 0)), (12,), ((13, 7),), 14), 200)
    s.apply(Changed(K1, 1500, ((11, 200, 4000),), True), 300)
    s.apply(Init(K0, 0), 400)
    return s


# Pinned: a broker restarts from snapshots an older version wrote.
GOLDEN_SNAPSHOT = bytes.fromhex(
    "54525353 01 00000000000001f4 0000003b e348c50d"  # "TRSS", v1, position 500, length, CRC
    "02"  # two queues, in key order
    "0001 67 0001 74 00000000 00 00 00 00"  # g/t/0: floor 0, cursor 0, no slots, no entries
    "0001 67 0001 74 00000001 0a 0e"  # g/t/1: floor 10, cursor 14
    "03"  # three slots:
    "01 01 00 c801 e807 d00f"  # in flight, attempt 1, no group, lease 200, 1000 .. 2000
    "02 01 00 ac02 dc0b a01f"  # released (nack) by lease 300 at 1500, visible at 4000
    "03 00 07 00 00 00"  # held, group 7
    "03 00 00 01 01 02 02"  # entries 10 -> slot 0, 11 -> slot 1, 13 -> slot 2 (12: filtered)
)


def test_snapshot_has_pinned_bytes_and_round_trips() -> None:
    s = small_states()
    assert s.encode_snapshot(500) == GOLDEN_SNAPSHOT
    position, back = ReceiveStates.decode_snapshot(GOLDEN_SNAPSHOT)
    assert position == 500
    assert back == s
    q = back.get(K1)
    assert q is not None
    assert q.check(10, 200, 1999) is HandleStatus.OK
    assert q.counts(1600, RetryPolicy()) == (1, 1, 1)


def test_snapshot_refuses_corruption() -> None:
    good = GOLDEN_SNAPSHOT
    cases = {
        "magic": b"XRSS" + good[4:],
        "version": good[:4] + b"\x02" + good[5:],
        "CRC": good[:-1] + b"\x03",
        "body": good[:-1],
        "truncated": good[:10],
    }
    for why, bad in cases.items():
        with pytest.raises(SnapshotFormatError, match=why):
            ReceiveStates.decode_snapshot(bad)
    # a well-sealed body with an entry beyond the cursor is refused too
    s = small_states().encode_snapshot(1)
    body = bytearray(s[21:])
    assert body[-7:] == bytes.fromhex("03 00 00 01 01 02 02")
    body[-7:] = bytes.fromhex("03 00 00 03 02 fe 01")
    resealed = struct.pack(">4sBqII", b"TRSS", 1, 1, len(body), zlib.crc32(body)) + bytes(body)
    with pytest.raises(SnapshotFormatError, match="body"):
        ReceiveStates.decode_snapshot(resealed)
    assert issubclass(SnapshotFormatError, ValueError)


def test_init_creates_other_events_for_unknown_queues_are_ignored_reset_creates() -> None:
    s = ReceiveStates()
    s.apply(Acked(K0, ((0, 1),)), 10)
    s.apply(Received(K0, T0, T0, ((0, 1, 0),), (), (), 1), 20)
    assert len(s) == 0
    s.apply(Init(K0, 5), 30)
    s.apply(Init(K0, 9), 40)  # a second Init does not move a queue
    q = s.get(K0)
    assert q is not None and (q.floor, q.cursor) == (5, 5)
    s.apply(Reset(K1, 7), 50)
    q1 = s.get(K1)
    assert q1 is not None and (q1.floor, q1.cursor) == (7, 7)


def test_keys_for_and_drop_group() -> None:
    s = ReceiveStates()
    for key in (K0, K1, QueueKey("g", "u", 0), QueueKey("h", "t", 0)):
        s.apply(Init(key, 0), 1)
    assert s.keys_for("g", "t") == [K0, K1]
    assert len(s.keys_for("g")) == 3
    assert s.drop_group("g") == 3
    assert s.keys() == [QueueKey("h", "t", 0)]


def test_in_flight_memory_per_message_is_measured_for_100k_batched_messages() -> None:
    per_entry = measure_bytes_per_entry(100_000, batch=32)
    # a dict slot and the offset's int; the lease record is shared by the batch
    assert 40 < per_entry < 130, per_entry


# ---- property-style checks on random histories ----

GROUPS = (0, 101, 202, 303)


def _random_history(seed: int, *, fifo: bool, steps: int = 300) -> Driver:
    """Drive a queue like a broker under random consumers, checking the guarantees at every
    step against a model of who holds what; returns the driver with its event log."""
    rng = random.Random(seed)
    policy = rng.choice(
        [
            RetryPolicy(delays_ms=(500, 2_000)),
            RetryPolicy(delays_ms=(), initial_ms=100, max_ms=5_000, multiplier=3.0),
        ]
    )
    d = Driver(
        policy=policy,
        fifo=fifo,
        max_attempts=rng.choice([2, 3, 16]),
        max_held=rng.choice([2, 5, 10_000]),
    )
    groups = GROUPS if fifo else (0,)
    d.append(Init(KEY, 0))
    now = T0
    holders: list[tuple[int, int]] = []  # handles given out: (offset, lease)
    deadline: dict[int, int] = {}  # offset -> deadline of the lease that holds it now
    done: set[int] = set()

    def add_messages(n: int) -> None:
        for _ in range(n):
            d.log.add(matches=rng.random() < 0.9, group=rng.choice(groups))

    add_messages(20)
    policies = [
        policy,
        RetryPolicy(delays_ms=(3_000,)),
        RetryPolicy(delays_ms=(), initial_ms=50, max_ms=60_000, multiplier=10.0),
    ]
    for _ in range(steps):
        now += rng.choice([0, 1, 50, 400, 2_500, 40_000, -300])  # wall clocks step back too
        if rng.random() < 0.03:  # an operator changes the group's settings
            policy = d.policy = rng.choice(policies)
            d.max_attempts = rng.choice([2, 3, 16])
        if rng.random() < 0.2:
            add_messages(rng.randint(1, 10))
        q = d.q
        op = rng.random()
        if op < 0.35:
            n = rng.randint(1, 8)
            walk = walk_fifo_retries if fifo else walk_retries
            walked = walk(q, now, n, d.max_attempts, policy)
            plan = d.plan(now, n)
            # the indexes find exactly what a walk over every entry finds
            retried = [o for o, *_ in plan.delivered if o < q.cursor] if plan else []
            assert retried == walked
            if plan is None:
                continue
            done.update(plan.filtered)  # filtered out: done, never blocking its group
            for o, attempt, gh, message in plan.delivered:
                assert o not in done, f"offset {o} delivered after it was done"
                assert deadline.get(o, now) <= now, f"offset {o} handed out while leased"
                assert attempt <= d.max_attempts
                assert (message is None) == (o < q.cursor)
                if fifo and gh:
                    earlier = [p for p in range(o) if d.log.messages[p][1] == gh]
                    assert all(p in done for p in earlier), f"group order broken at {o}"
            invisible = rng.choice([100, 1_000, 30_000])
            lease = d.append(plan.event(KEY, now, now + invisible))
            for o, *_ in plan.delivered:
                deadline[o] = now + invisible
                holders.append((o, lease))
            if fifo:
                leased = [
                    d.log.messages[o][1] for o, t in deadline.items() if t > now and o not in done
                ]
                named = [g for g in leased if g]
                assert len(named) == len(set(named)), "two messages of a group in flight"
        elif op < 0.85 and holders:
            o, lease = rng.choice(holders)
            status = q.check(o, lease, now)
            if o in done:
                assert status is HandleStatus.ACKED
            if status is not HandleStatus.OK:
                # a record whose lease lost a race (not merely expired: that one still
                # matches, the master refuses it before it is written) changes nothing
                if status is not HandleStatus.EXPIRED and rng.random() < 0.3:
                    before = q.state()
                    d.append(Acked(KEY, ((o, lease),)))
                    assert q.state() == before
                continue
            assert deadline[o] > now
            if op < 0.6:
                d.append(Acked(KEY, ((o, lease),)))
                done.add(o)
                del deadline[o]
            elif op < 0.72:
                visible = now + policy.delay_ms(q.attempt(o))
                d.append(Changed(KEY, now, ((o, lease, visible),), released=True))
                del deadline[o]
            else:
                until = now + rng.choice([0, 10, 5_000, 60_000])
                new = d.append(Changed(KEY, now, ((o, lease, until),), released=False))
                deadline[o] = until
                holders.append((o, new))
        else:
            # a long-poll timer set by next_visible_ms never wakes later than needed
            timer = q.next_visible_ms(now, policy, max_attempts=d.max_attempts)
            exact = walk_next_visible(q, now, d.max_attempts, policy)
            assert timer is None or timer > now
            if exact is not None:
                assert timer is not None and timer <= exact
            dead = q.dead_candidates(now, d.max_attempts, policy)
            assert dead == walk_dead(q, now, d.max_attempts)
            for o, _ in dead:
                assert deadline.get(o, now) <= now
            if dead:
                d.append(Dead(KEY, tuple(dead)))
                done.update(o for o, _ in dead)
        assert q.floor == min([o for o in range(q.cursor) if o not in done], default=q.cursor)
    return d


def _drain(d: Driver, now: int) -> set[int]:
    """Receive and ack everything left; the offsets acked or dead-lettered meanwhile."""
    finished: set[int] = set()
    for _ in range(10_000):
        q = d.q
        if q.floor == len(d.log.messages):
            return finished
        now += 10**8
        dead = q.dead_candidates(now, d.max_attempts, d.policy)
        if dead:
            d.append(Dead(KEY, tuple(dead)))
            finished.update(o for o, _ in dead)
        lease, delivered = d.receive(now, 64)
        if delivered:
            d.append(Acked(KEY, tuple((o, lease) for o, *_ in delivered)))
            finished.update(o for o, *_ in delivered)
    raise AssertionError("the queue did not drain")


@pytest.mark.parametrize("fifo", [False, True], ids=["plain", "fifo"])
def test_random_histories_keep_every_guarantee_and_lose_nothing(fifo: bool) -> None:
    for seed in range(40):
        d = _random_history(seed, fifo=fifo)
        _drain(d, T0 + 10**10)
        q = d.q
        assert (q.floor, q.cursor, len(q)) == (len(d.log.messages),) * 2 + (0,)


@pytest.mark.parametrize("fifo", [False, True], ids=["plain", "fifo"])
def test_replaying_the_same_events_rebuilds_the_same_state(fifo: bool) -> None:
    for seed in range(40):
        d = _random_history(seed, fifo=fifo)
        replayed = ReceiveStates()
        for ev, lease in d.events:
            replayed.apply(ev, lease)
        assert replayed == d.states
        # and from a snapshot taken anywhere, then the rest of the log
        rng = random.Random(seed)
        cut = rng.randrange(len(d.events) + 1)
        partial = ReceiveStates()
        for ev, lease in d.events[:cut]:
            partial.apply(ev, lease)
        position, resumed = ReceiveStates.decode_snapshot(partial.encode_snapshot(cut))
        assert position == cut
        assert resumed == partial
        for ev, lease in d.events[cut:]:
            resumed.apply(ev, lease)
        assert resumed == d.states


def _arbitrary_event(rng: random.Random) -> Event:
    key = rng.choice([K0, K1])

    def o() -> int:
        return rng.randint(0, 30)

    def lease() -> int:
        return rng.randrange(0, 3_000, 100)

    now = T0 + rng.randint(0, 10**6)
    kind = rng.randrange(7)
    if kind == 0:
        return Init(key, o())
    if kind == 1:
        return Reset(key, o())
    if kind in (2, 3):
        delivered = tuple((o(), rng.randint(1, 4), rng.choice(GROUPS)) for _ in range(4))
        held = tuple((o(), rng.choice(GROUPS)) for _ in range(2))
        filtered = tuple(o() for _ in range(2))
        return Received(key, now, now + 1_000, delivered, filtered, held, o() + rng.randint(0, 5))
    if kind == 4:
        return Acked(key, tuple((o(), lease()) for _ in range(3)))
    if kind == 5:
        return Dead(key, tuple((o(), lease()) for _ in range(3)))
    return Changed(key, now, tuple((o(), lease(), now + 5) for _ in range(3)), rng.random() < 0.5)


def test_arbitrary_event_sequences_apply_deterministically_and_snapshot_exactly() -> None:
    rng = random.Random(2026)
    for _ in range(60):
        events = [(_arbitrary_event(rng), 100 * (i + 1)) for i in range(rng.randint(1, 60))]
        a, b = ReceiveStates(), ReceiveStates()
        for ev, lease in events:
            a.apply(ev, lease)
            b.apply(ev, lease)
            assert ReceiveStates.decode_snapshot(a.encode_snapshot(lease))[1] == a
        assert a == b
        for _, q in a:
            assert q.floor <= q.cursor
            assert all(q.floor <= off < q.cursor for off, _ in q.items())


def test_a_stuck_fifo_group_never_delays_other_groups_within_the_window() -> None:
    stuck = 999
    for seed in range(30):
        rng = random.Random(seed)
        max_held = rng.randint(1, 20)
        d = Driver(fifo=True, max_held=max_held)
        d.append(Init(KEY, 0))
        # the stuck group's head first, then at most max_held more of it among other groups
        d.log.add(group=stuck)
        stuck_more = rng.randint(0, max_held)
        others = rng.randint(1, 60)
        mix = [stuck] * stuck_more + [rng.choice([0, 1, 2, 3]) for _ in range(others)]
        rng.shuffle(mix)
        for g in mix:
            d.log.add(group=g)
        now = T0
        head_lease, delivered = d.receive(now, 1, invisible_ms=10**9)  # held "forever"
        assert delivered[0][0] == 0
        got: set[int] = set()
        for _ in range(200):
            now += 1
            lease, delivered = d.receive(now, rng.randint(1, 5))
            if not lease:
                break  # nothing left to deliver, hold or filter
            assert all(d.log.messages[o][1] != stuck for o, *_ in delivered)
            got.update(o for o, *_ in delivered)
            if delivered:
                d.append(Acked(KEY, tuple((o, lease) for o, *_ in delivered)))
        expected = {o for o, (_, g) in enumerate(d.log.messages) if g != stuck}
        assert got == expected, f"seed {seed}: other groups waited on the stuck one"
        assert d.q.counts(now, d.policy)[2] == stuck_more
        assert d.q.check(0, head_lease, now) is HandleStatus.OK


def test_acked_messages_leave_no_memory_behind_even_under_long_leases() -> None:
    d = Driver()
    d.log.messages = [(True, 0)] * 64_000
    d.append(Init(KEY, 0))
    twelve_hours = 12 * 3_600_000
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):
            lease, delivered = d.receive(T0 + i, 32, invisible_ms=twelve_hours)
            d.append(Acked(KEY, tuple((o, lease) for o, *_ in delivered)))
        d.events.clear()  # the test's own record of the log
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert (d.q.floor, len(d.q)) == (64_000, 0)
    assert left < 64_000, f"{left} bytes left after acking 64000 messages"
