"""Both state machines driven over two real stores, with no sockets: the transport's job done by
hand, so probes, truncation and the slave's own dispatch are checked byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.replication.copied_logs import FILE_BYTES as FILE
from tests.replication.copied_logs import open_store
from tidemq.replication import Accept, Identity, MasterTracker, ReplicationConfig, SlaveSession
from tidemq.replication.handshake import Handshake, decide_handshake
from tidemq.replication.log import slave_probes
from tidemq.replication.master import Send
from tidemq.storage import Message, MessageStore, PutStatus

pytestmark = pytest.mark.store

CFG = ReplicationConfig(chunk_bytes=1000, max_in_flight_bytes=3000)


def put(store: MessageStore, prefix: str, n: int) -> None:
    for i in range(n):
        r = store.put_message(Message("t", f"{prefix}-{i}".encode() * 7, queue_id=i % 2))
        assert r.wait(5) is PutStatus.PUT_OK


def replicate(master: MessageStore, slave: MessageStore) -> Accept:
    """One link, run until the slave holds everything the master has."""
    cl = slave.log
    hs = Handshake(
        Identity("c", "b", 1),
        FILE,
        not cl.file_base_offsets(),
        cl.min_offset,
        cl.max_offset,
        slave_probes(cl),
    )
    decision = decide_handshake(Identity("c", "b", 0), FILE, hs, master.log)
    assert isinstance(decision, Accept), decision
    session = SlaveSession(FILE, 5000, 20000, now_ms=0)
    cut = session.on_accepted(
        decision.start_offset,
        decision.truncate,
        decision.reason,
        decision.master_max_offset,
        not cl.file_base_offsets(),
        cl.max_offset,
        0,
    )
    if cut is not None:
        slave.truncate_to(cut.offset, cut.reason)
    tracker = MasterTracker(CFG, FILE)
    link = tracker.connect(1, decision, 0).link_id
    while isinstance(a := tracker.next_action(link, master.log.max_offset, 0), Send):
        data = master.read_raw(a.offset, a.length)
        tracker.on_sent(link, a.offset, len(data), 0)
        session.on_chunk(a.offset, len(data), 0)
        session.on_appended(slave.append_raw(a.offset, data))
        tracker.on_report(link, session.expected_offset or 0, 0)
    return decision


def commitlog_bytes(store: MessageStore) -> bytes:
    cl = store.log
    return b"".join(cl.read_raw(base, FILE) for base in cl.file_base_offsets())


def assert_same(master: MessageStore, slave: MessageStore) -> None:
    assert slave.log.max_offset == master.log.max_offset
    assert commitlog_bytes(slave) == commitlog_bytes(master)
    end = master.log.max_offset
    # Dispatch runs on each store's own thread: both must have published everything.
    assert master.wait_dispatched(end, 30)
    assert slave.wait_dispatched(end, 30)
    for q in (0, 1):
        want = master.get_messages("t", q, 0, 1000, 1 << 30)
        got = slave.get_messages("t", q, 0, 1000, 1 << 30)
        assert [(m.queue_offset, m.body) for m in got.messages] == [
            (m.queue_offset, m.body) for m in want.messages
        ]


def test_empty_slave_gets_every_file_then_continues(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "s") as slave:
        put(master, "a", 300)
        assert len(master.log.file_base_offsets()) > 5
        assert replicate(master, slave).start_offset == 0
        assert_same(master, slave)
        before = slave.log.max_offset
        put(master, "b", 50)
        d = replicate(master, slave)
        assert (d.truncate, d.start_offset) == (False, before)
        assert_same(master, slave)


def test_diverged_tail_is_cut_kept_as_evidence_and_replaced(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "s") as slave:
        put(master, "common", 120)
        replicate(master, slave)
        common = master.log.max_offset
        put(master, "master-only", 80)
        put(slave, "slave-only", 60)  # the slave acted as a master for a while
        d = replicate(master, slave)
        assert d.truncate
        assert d.start_offset <= common
        assert os.listdir(tmp_path / "s" / "evidence")
        assert_same(master, slave)


def test_slave_beyond_the_master_is_cut_back(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "s") as slave:
        put(master, "x", 100)
        replicate(master, slave)
        put(slave, "ahead", 100)
        d = replicate(master, slave)
        assert d.truncate and "beyond the master's" in d.reason
        assert_same(master, slave)


def test_a_sync_flush_slave_reports_only_what_its_store_has_flushed(tmp_path: Path) -> None:
    master, slave = open_store(tmp_path / "m"), open_store(tmp_path / "s")
    try:
        put(master, "m", 20)
        session = SlaveSession(FILE, 5000, 20000, now_ms=0, flush_sync=True)
        session.on_accepted(0, False, "", master.log.max_offset, True, 0, 0)
        data = master.read_raw(0, 1000)
        session.on_chunk(0, len(data), 0)
        session.on_appended(slave.append_raw(0, data))
        assert slave.stats().flushed_offset < len(data)  # in the page cache only
        assert session.ack_offset() == 0
        assert session.flush_due(more_waiting=False)
        session.on_flushed(slave.flush_commitlog())
        assert session.ack_offset() == len(data) == slave.stats().flushed_offset
    finally:
        master.close()
        slave.close()
