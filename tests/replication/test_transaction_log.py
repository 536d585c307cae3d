"""The transaction logs over real stores, the replication copied by hand: a follower applying the
copied records holds the master's open transactions; a restart rebuilds them from the logs; a
commit torn between its message and its op record (a crash, or a replication chunk cut between
them) is found through the index, so it is never committed twice; retention is pinned at the
oldest open half."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.replication.copied_logs import copy_log, open_store
from tidemq.services.broker.transactions.events import (
    HALF_TOPIC,
    Checked,
    Resolution,
    Resolved,
)
from tidemq.services.broker.transactions.halves import to_committed, to_half
from tidemq.services.broker.transactions.log import TransactionLog
from tidemq.storage import Message, MessageStore

pytestmark = pytest.mark.store

NOW = 1_700_000_000_000


def send_halves(store: MessageStore, n: int, first: int = 0) -> list[int]:
    """``n`` half messages, as a transactional send stores them; their offsets."""
    put = store.put_messages(
        [
            to_half(Message(topic="payments", body=f"m{first + i}".encode(), queue_id=1), "g")
            for i in range(n)
        ]
    )
    assert store.wait_dispatched(store.log.max_offset, 10)
    return [r.phy_offset for r in put.results]


def opened(store: MessageStore) -> TransactionLog:
    """A transaction log as a broker holds it after start-up."""
    txlog = TransactionLog(store)
    txlog.open()
    return txlog


def commit(txlog: TransactionLog, offset: int) -> None:
    half = txlog.half(offset)
    assert half is not None
    txlog.append(Resolved(offset, Resolution.COMMIT, False), [to_committed(half)])


def test_a_follower_applying_the_copied_logs_holds_the_masters_open_transactions(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        master, follower = opened(m), opened(s)
        offsets = send_halves(m, 4)
        master.catch_up()
        commit(master, offsets[0])
        master.append(Resolved(offsets[1], Resolution.ROLLBACK, True))
        master.append(Checked(offsets[2], 1, NOW))
        assert m.wait_dispatched(m.log.max_offset, 10)
        copy_log(m, s)
        follower.catch_up(verify=True)
        assert sorted(follower.state.open) == sorted(master.state.open) == offsets[2:]
        assert follower.state.open[offsets[2]].checks == 1
        assert follower.retention_position() == (HALF_TOPIC, 0, 2)
        # Nothing open: nothing pinned.
        master.append(Resolved(offsets[2], Resolution.ROLLBACK, False))
        master.append(Resolved(offsets[3], Resolution.ROLLBACK, False))
        assert master.retention_position() is None


def test_a_restart_rebuilds_the_open_transactions_from_the_logs(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m:
        txlog = opened(m)
        offsets = send_halves(m, 3)
        txlog.catch_up()
        commit(txlog, offsets[1])
        txlog.append(Checked(offsets[2], 2, NOW))
    with open_store(tmp_path / "m") as m:
        again = opened(m)
        assert sorted(again.state.open) == [offsets[0], offsets[2]]
        assert again.state.open[offsets[2]].checks == 2
        assert again.repair() == []  # nothing torn


def test_a_commit_whose_op_record_was_lost_is_found_committed_not_open(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m:
        txlog = opened(m)
        torn, untouched = send_halves(m, 2)
        txlog.catch_up()
        half = txlog.half(torn)
        assert half is not None
        # The prefix a crash keeps of [committed message, Resolved]: the message alone.
        m.put_messages([to_committed(half)])
        assert m.wait_dispatched(m.log.max_offset, 10)
    with open_store(tmp_path / "m") as m:
        again = opened(m)
        assert sorted(again.state.open) == [torn, untouched]  # the op log alone says open
        assert [h.offset for h in again.repair()] == [torn]


def test_a_slave_whose_log_was_cut_back_rebuilds(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        master, follower = opened(m), opened(s)
        offsets = send_halves(m, 2)
        master.catch_up()
        copy_log(m, s)
        follower.catch_up(verify=True)
        cut = s.log.max_offset
        more = send_halves(m, 2, first=2)
        copy_log(m, s)
        follower.catch_up(verify=True)
        assert sorted(follower.state.open) == offsets + more
        s.truncate_to(cut, "diverged")  # a diverged tail, cut back to the new master's history
        assert s.wait_dispatched(s.log.max_offset, 10)
        follower.catch_up(verify=True)
        assert sorted(follower.state.open) == offsets
        assert follower.rebuilds == 1


def test_catch_up_fully_applies_everything_dispatched(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m:
        txlog = opened(m)
        offsets = send_halves(m, 700)  # more than one chunk
        asyncio.run(txlog.catch_up_fully())
        assert len(txlog.state) == len(offsets)


def test_a_diverged_tail_replaced_by_the_new_masters_history_rebuilds(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        new_master, follower = opened(m), opened(s)
        common = send_halves(m, 2)
        copy_log(m, s)
        follower.catch_up(verify=True)
        cut = s.log.max_offset
        # The old master (s) stored halves its slaves never got, and resolved one of them...
        diverged = send_halves(s, 2, first=100)
        follower.catch_up(verify=True)
        follower.append(Resolved(common[0], Resolution.ROLLBACK, False))
        assert sorted(follower.state.open) == [common[1], *diverged]
        # ...while the new master (m) wrote other records at the same places (as many or more:
        # the logs did not get shorter, only different).
        theirs = send_halves(m, 3, first=200)
        new_master.catch_up()
        new_master.append(Checked(common[1], 1, NOW))
        assert m.wait_dispatched(m.log.max_offset, 10)
        s.truncate_to(cut, "diverged")
        copy_log(m, s)
        follower.catch_up(verify=True)
        assert sorted(follower.state.open) == common + theirs
        assert follower.state.open[common[1]].checks == 1
        assert follower.rebuilds == 1
