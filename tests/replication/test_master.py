"""The master's state machine, scripted: handshakes against an in-memory log, then progress."""

from __future__ import annotations

import zlib

import pytest

from tidemq.replication import (
    Accept,
    Identity,
    MasterTracker,
    Refusal,
    RefusalKind,
    ReplicationConfig,
)
from tidemq.replication.epochs import EpochEntry
from tidemq.replication.handshake import Handshake, decide_by_epochs, decide_handshake
from tidemq.replication.log import Probe
from tidemq.replication.master import Drop, Send, SendHeartbeat, Wait

pytestmark = pytest.mark.unit

FILE = 1000
MASTER = Identity("c", "b", 0)
SLAVE = Identity("c", "b", 1)


class MemLog:
    """A log holding ``data`` from ``base`` on."""

    def __init__(self, data: bytes, base: int = 0) -> None:
        self.data = data
        self.base = base

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        return self.base + len(self.data)

    def crc_of(self, offset: int, length: int) -> int | None:
        if offset < self.base or offset + length > self.max_offset or length <= 0:
            return None
        lo = offset - self.base
        return zlib.crc32(self.data[lo : lo + length])


def probe(data: bytes, offset: int, length: int) -> Probe:
    return Probe(offset, length, zlib.crc32(data[offset : offset + length]))


def hs(
    data: bytes = b"",
    *,
    probes: tuple[Probe, ...] = (),
    who: Identity = SLAVE,
    empty: bool = False,
    min_offset: int = 0,
    file_size: int = FILE,
) -> Handshake:
    return Handshake(who, file_size, empty, min_offset, min_offset + len(data), probes)


MASTER_LOG = bytes(range(256)) * 4  # 1024 bytes; "records" are 100 bytes in these scripts


@pytest.mark.parametrize(
    ("who", "needle"),
    [
        (Identity("other", "b", 1), "not in this group"),
        (Identity("c", "other", 1), "not in this group"),
        (Identity("c", "b", 0), "broker id 0"),
        (Identity("c", "b", -3), "broker id -3"),
    ],
)
def test_strangers_are_refused_with_a_reason(who: Identity, needle: str) -> None:
    d = decide_handshake(MASTER, FILE, hs(who=who, empty=True), MemLog(MASTER_LOG))
    assert isinstance(d, Refusal)
    assert d.kind is RefusalKind.STRANGER
    assert needle in d.reason


def test_other_file_size_is_incompatible() -> None:
    d = decide_handshake(MASTER, FILE, hs(empty=True, file_size=2000), MemLog(MASTER_LOG))
    assert isinstance(d, Refusal)
    assert d.kind is RefusalKind.INCOMPATIBLE


def test_empty_slave_starts_at_the_masters_min_offset_not_its_last_file() -> None:
    d = decide_handshake(MASTER, FILE, hs(empty=True), MemLog(MASTER_LOG, base=3000))
    assert d == Accept(3000, False, d.reason, 3000, 4024)


def test_slave_holding_a_prefix_continues_where_it_ends() -> None:
    mine = MASTER_LOG[:550]
    tail = probe(mine, 500, 50)  # from its last whole record to its end
    d = decide_handshake(MASTER, FILE, hs(mine, probes=(tail,)), MemLog(MASTER_LOG))
    assert isinstance(d, Accept)
    assert (d.start_offset, d.truncate) == (550, False)


def test_diverged_tail_is_cut_back_to_the_newest_common_record() -> None:
    mine = MASTER_LOG[:300] + b"x" * 250
    probes = (
        probe(mine, 500, 50),
        probe(mine, 400, 100),
        probe(mine, 200, 100),
        probe(mine, 0, 100),
    )
    d = decide_handshake(MASTER, FILE, hs(mine, probes=probes), MemLog(MASTER_LOG))
    assert isinstance(d, Accept)
    assert (d.start_offset, d.truncate) == (300, True)
    assert "last common offset 300" in d.reason


def test_slave_beyond_the_master_is_cut_back_even_when_its_prefix_matches() -> None:
    mine = MASTER_LOG + b"y" * 100
    probes = (probe(mine, 1024, 100), probe(mine, 1024, 100), probe(mine, 0, 100))
    d = decide_handshake(MASTER, FILE, hs(mine, probes=probes), MemLog(MASTER_LOG))
    assert isinstance(d, Accept)
    assert (d.start_offset, d.truncate) == (100, True)
    assert "beyond the master's 1024" in d.reason


def test_nothing_in_common_from_the_same_start_cuts_everything() -> None:
    mine = b"z" * 400
    d = decide_handshake(
        MASTER,
        FILE,
        hs(mine, probes=(probe(mine, 300, 100), probe(mine, 0, 100))),
        MemLog(MASTER_LOG),
    )
    assert isinstance(d, Accept)
    assert (d.start_offset, d.truncate) == (0, True)


def test_slave_behind_the_retained_history_resynchronises_from_the_masters_min_offset() -> None:
    mine = MASTER_LOG[:300]
    d = decide_handshake(
        MASTER, FILE, hs(mine, probes=(probe(mine, 200, 100),)), MemLog(MASTER_LOG[500:], base=500)
    )
    assert isinstance(d, Accept)
    assert (d.start_offset, d.truncate, d.resync) == (500, False, True)
    assert (d.master_min_offset, d.master_max_offset) == (500, 1024)
    assert "below the master's min offset 500" in d.reason


def test_slave_behind_resynchronises_under_epochs_too() -> None:
    slave = Handshake(SLAVE, FILE, False, 0, 300, (), epochs=(EpochEntry(1, 0),))
    d = decide_by_epochs(
        slave, (EpochEntry(1, 0), EpochEntry(2, 200)), MemLog(MASTER_LOG[500:], base=500)
    )
    assert isinstance(d, Accept)
    assert (d.start_offset, d.resync) == (500, True)


def test_slave_reaching_into_the_retained_history_without_a_common_record_is_refused() -> None:
    mine = b"z" * 700  # from 0 to 700, the master keeps [500, 1024): no record in common
    d = decide_handshake(
        MASTER,
        FILE,
        hs(mine, probes=(probe(mine, 600, 100), probe(mine, 0, 100))),
        MemLog(MASTER_LOG[500:], base=500),
    )
    assert isinstance(d, Refusal)
    assert (d.kind, d.master_min_offset, d.master_max_offset) == (
        RefusalKind.NO_COMMON_HISTORY,
        500,
        1024,
    )


CFG = ReplicationConfig(
    chunk_bytes=300,
    max_in_flight_bytes=600,
    heartbeat_interval_ms=1000,
    idle_timeout_ms=5000,
    report_interval_ms=1000,
)


def tracker_at(start: int) -> tuple[MasterTracker, int]:
    t = MasterTracker(CFG, FILE)
    link = t.connect(1, Accept(start, False, "", 0, 0), now_ms=0)
    return t, link.link_id


def test_chunks_are_capped_by_size_window_and_file_boundary() -> None:
    t, link = tracker_at(800)
    assert t.next_action(link, 2500, 0) == Send(800, 200)  # the file ends at 1000
    t.on_sent(link, 800, 200, 0)
    assert t.next_action(link, 2500, 0) == Send(1000, 300)
    t.on_sent(link, 1000, 300, 0)
    assert t.next_action(link, 2500, 0) == Send(1300, 100)  # 600 in flight at most
    t.on_sent(link, 1300, 100, 0)
    assert t.next_action(link, 2500, 10) == Wait()
    t.on_report(link, 1300, 20)
    assert t.next_action(link, 2500, 20) == Send(1400, 300)
    assert t.links[link].lag_bytes(2500) == 1200


def test_idle_link_heartbeats_then_a_silent_slave_is_dropped() -> None:
    t, link = tracker_at(0)
    assert t.next_action(link, 0, 999) == Wait()
    assert t.next_action(link, 0, 1000) == SendHeartbeat()
    t.on_heartbeat_sent(link, 1000)
    assert t.next_action(link, 0, 1500) == Wait()
    t.on_report(link, 0, 4000)
    assert isinstance(t.next_action(link, 0, 8999), SendHeartbeat)
    assert t.next_action(link, 0, 9000) == Drop("slave silent for 5000 ms")


@pytest.mark.parametrize(
    ("report", "needle"), [(500, "beyond the 300 sent"), (100, "below the 200 already")]
)
def test_a_report_of_bytes_never_sent_or_going_back_drops_the_link(
    report: int, needle: str
) -> None:
    t, link = tracker_at(0)
    t.on_sent(link, 0, 300, 0)
    t.on_report(link, 200, 0)
    t.on_report(link, report, 0)
    action = t.next_action(link, 1000, 0)
    assert isinstance(action, Drop)
    assert needle in action.reason
    assert t.links[link].acked_offset == 200  # the bad report acknowledged nothing


def test_a_reconnecting_slave_replaces_its_old_link() -> None:
    t, old = tracker_at(0)
    new = t.connect(1, Accept(0, False, "", 0, 0), now_ms=5).link_id
    assert isinstance(t.next_action(old, 0, 5), Drop)
    t.disconnect(old)
    assert [p.link_id for p in t.progress()] == [new]
    assert t.next_action(new, 10, 5) == Send(0, 10)
