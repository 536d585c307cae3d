"""The receive journal over two real stores, the replication copied by hand: a follower applying
the copied log holds the master's state; a log cut back under it rebuilds the state from the
newest snapshot the log still agrees with, or by replaying the log; a restart starts from a
snapshot and replays only what follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.replication.copied_logs import copy_log, open_store
from tidemq.services.broker.receive.events import Acked, Changed, Init, QueueKey, Received
from tidemq.services.broker.receive.journal import ReceiveJournal
from tidemq.services.broker.receive.states import ReceiveStates

pytestmark = pytest.mark.store

KEY = QueueKey("workers", "jobs", 0)
NOW = 1_700_000_000_000


def deliver(journal: ReceiveJournal, first: int, n: int, now: int = NOW) -> int:
    """Deliver offsets first..first+n-1 under one lease; returns the lease."""
    lease, _ = journal.append(
        Received(
            KEY,
            now,
            now + 30_000,
            tuple((o, 1, 0) for o in range(first, first + n)),
            (),
            (),
            first + n,
        )
    )
    return lease


def events_a(journal: ReceiveJournal) -> None:
    journal.append(Init(KEY, 0))
    lease = deliver(journal, 0, 4)
    journal.append(Acked(KEY, ((0, lease), (2, lease))))


def events_b(journal: ReceiveJournal) -> None:
    lease = deliver(journal, 4, 3, NOW + 1)
    journal.append(Changed(KEY, NOW + 2, ((4, lease, NOW + 500),), True))
    journal.append(Acked(KEY, ((5, lease),)))


def test_a_follower_applying_the_copied_log_holds_the_masters_state(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        master, slave = (
            ReceiveJournal(m, str(tmp_path / "m")),
            ReceiveJournal(s, str(tmp_path / "s")),
        )
        master.open()
        slave.open()
        events_a(master)
        events_b(master)
        copy_log(m, s)
        assert slave.catch_up() == 6
        assert slave.states == master.states
        assert slave.mark == master.mark
        q = slave.states.get(KEY)
        assert q is not None and (q.floor, q.cursor) == (1, 7)
        assert slave.catch_up() == 0  # nothing new


def test_a_master_ahead_of_dispatch_keeps_its_state_and_does_not_rebuild(tmp_path: Path) -> None:
    # The master applies its records as it appends them; a catch-up (woken by dispatch of an
    # earlier record) that runs before dispatch publishes the newest must not take that for
    # a log cut back: a rebuild would replay the log without it.
    with open_store(tmp_path / "m") as m:
        master = ReceiveJournal(m, str(tmp_path / "m"))
        master.open()
        events_a(master)
        assert m.wait_dispatched(m.log.max_offset, 10)
        with m.dispatch_held():
            events_b(master)
            want = ReceiveStates.decode_snapshot(master.states.encode_snapshot(0))[1]
            assert master.catch_up() == 0
            assert master.rebuilds == 0
            assert master.states == want
        assert m.wait_dispatched(m.log.max_offset, 10)
        assert master.catch_up() == 0
        assert master.rebuilds == 0 and master.states == want


def test_a_log_cut_back_under_a_follower_rebuilds_from_the_snapshot_it_agrees_with(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        master, slave = (
            ReceiveJournal(m, str(tmp_path / "m")),
            ReceiveJournal(s, str(tmp_path / "s")),
        )
        master.open()
        slave.open()
        events_a(master)
        copy_log(m, s)
        slave.catch_up()
        after_a = ReceiveStates.decode_snapshot(slave.states.encode_snapshot(0))[1]
        cut_at = s.log.max_offset
        snap = slave.snapshot_bytes()
        assert snap is not None
        slave.write_snapshot(*snap)
        events_b(master)
        copy_log(m, s)
        assert slave.catch_up() == 3
        assert slave.states != after_a
        # A failover cuts the follower's log back to the end of A.
        s.truncate_to(cut_at, "a diverged tail")
        assert slave.catch_up() == 0
        assert slave.rebuilds == 1
        assert slave.states == after_a
        assert slave.mark.next_offset == 3


def test_a_restart_uses_the_newest_snapshot_the_log_still_holds_and_replays_after_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "m"
    with open_store(root) as m:
        j = ReceiveJournal(m, str(root))
        j.open()
        events_a(j)
        j.write_snapshot(*j.snapshot_bytes())  # type: ignore[misc]
        events_b(j)
        want = j.states
        a_snapshot = j.snapshots.positions()
    with open_store(root) as m:
        j = ReceiveJournal(m, str(root))
        j.open()
        assert j.states == want
        assert j.snapshots.positions() == a_snapshot
        # Retention keeps the log from the record the oldest snapshot ends with.
        assert j.retention_position() == ("%SYS%RECEIVE_LOG", 0, a_snapshot[0] - 1)
        j.write_snapshot(*j.snapshot_bytes())  # type: ignore[misc]
        newest = j.snapshots.positions()[-1]
        cut_at = m.get_messages("%SYS%RECEIVE_LOG", 0, 3, 1).messages[0].phy_offset
    # The newest snapshot is damaged and the log lost everything after A (a power cut): the
    # damaged one and the one ahead of the log are passed over, and the state is A's.
    with open(j.snapshots.path(newest), "r+b") as f:
        f.seek(30)
        f.write(b"\xff\xff")
    with open_store(root) as m:
        m.truncate_to(cut_at, "lost tail")
        j = ReceiveJournal(m, str(root))
        j.open()
        q = j.states.get(KEY)
        assert q is not None and (q.floor, q.cursor, len(q)) == (1, 4, 2)
