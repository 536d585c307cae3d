"""Receive state that outlives a process on real brokers: a SIGKILL and restart, a slave that
rebuilds the master's state from the replicated log, acks under a sync master, and a failover."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration import replicas
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.failover import SESSION_MS, Group
from tests.integration.receiving import (
    FAST,
    TOPIC,
    ack,
    bodies,
    codes,
    create_topic,
    error_of,
    nack,
    receive,
    receive_until,
    send,
    set_group,
    state,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_in_flight_state_survives_sigkill_and_restart(start_broker: StartBroker) -> None:
    b = start_broker(*FAST, "--receive-snapshot-interval-ms", "200")
    create_topic(b)
    set_group(b, delays_ms=[100])
    send(b, [f"m{i}".encode() for i in range(10)])
    # Long enough for the restart to come well before the deadline.
    got = sorted(receive(b, invisible_ms=8_000), key=lambda m: m.message.body)
    assert len(got) == 10
    acked, held = got[:5], got[5:]
    assert codes(ack(b, [m.receipt_handle for m in acked])) == ["OK"] * 5
    send(b, [b"late"])  # never received before the kill
    b.kill()
    b = start_broker(*FAST, "--receive-snapshot-interval-ms", "200")
    # The held ones are still invisible and their handles still work; the acked ones are done.
    assert codes(ack(b, [held[0].receipt_handle])) == ["OK"]
    assert codes(ack(b, [acked[0].receipt_handle])) == ["MESSAGE_ALREADY_ACKED"]
    (late,) = receive(b)
    assert late.message.body == b"late" and late.delivery_attempt == 1
    back = receive_until(b, 4)
    assert bodies(back) == bodies(held[1:])
    assert {m.delivery_attempt for m in back} == {2}
    assert codes(ack(b, [m.receipt_handle for m in [*back, late]])) == ["OK"] * 5
    # A graceful restart (a snapshot at shutdown) keeps it all too.
    b.terminate()
    b = start_broker(*FAST)
    (q,) = state(b).queues
    assert (q.done_offset, q.next_offset, q.inflight, q.retrying) == (11, 11, 0, 0)
    assert receive(b, wait_ms=300) == []


def test_a_slave_rebuilds_the_masters_receive_state_from_the_replicated_log(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = replicas.start(start_broker, nameserver, "master", *FAST)
    create_topic(master, TOPIC, queues=2)
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    set_group(master, delays_ms=[60_000])
    for q in (0, 1):
        send(master, [f"q{q}-{i}".encode() for i in range(20)], queue_id=q)
    got = receive_until(master, 40, invisible_ms=120_000)
    assert codes(ack(master, [m.receipt_handle for m in got[:25]])) == ["OK"] * 25
    assert codes(nack(master, [m.receipt_handle for m in got[25:30]])) == ["OK"] * 5

    def figures(b: BrokerProcess) -> list[tuple[int, ...]]:
        return [
            (q.queue_id, q.done_offset, q.next_offset, q.inflight, q.retrying)
            for q in state(b).queues
        ]

    want = figures(master)
    assert sum(f[3] for f in want) == 10 and sum(f[4] for f in want) == 5
    wait_until(lambda: figures(slave) == want, 30, "the slave's receive state to match")
    # A slave refuses the calls that change it.
    _, name, retriable = error_of(lambda: receive(slave))
    assert (name, retriable) == ("NOT_MASTER", True)
    # And keeps following.
    assert codes(ack(master, [m.receipt_handle for m in got[30:]])) == ["OK"] * 10
    want = figures(master)
    wait_until(lambda: figures(slave) == want, 30, "the slave to follow the acks")
    # Restarted, the slave rebuilds the same state from its own log.
    slave.kill()
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    assert figures(slave) == want


def test_under_sync_master_an_ack_waits_for_the_slave_and_a_silent_slave_delays_but_never_stops_it(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = replicas.start(
        start_broker,
        nameserver,
        "master",
        *FAST,
        "--role",
        "SYNC_MASTER",
        "--ha-sync-timeout-ms",
        "800",
    )
    create_topic(master)
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    replicas.wait_in_sync(master)
    send(master, [b"a", b"b"])
    a, b = sorted(receive(master, invisible_ms=60_000), key=lambda m: m.message.body)
    assert codes(ack(master, [a.receipt_handle])) == ["OK"]
    slave.proc.send_signal(signal.SIGSTOP)  # connected but silent
    try:
        started = time.monotonic()
        # The ack waited for the slave up to the sync timeout, then was answered: consumption
        # goes on while the slave is away (the failover window for acks, docs/operations.md).
        assert codes(ack(master, [b.receipt_handle])) == ["OK"]
        assert time.monotonic() - started >= 0.7
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    assert codes(ack(master, [b.receipt_handle])) == ["MESSAGE_ALREADY_ACKED"]
    wait_until(lambda: state(slave).queues[0].done_offset == 2, 30, "the slave to hold both acks")


def test_after_a_failover_the_new_master_knows_what_was_acked_and_what_is_in_flight(
    start_broker: StartBroker,
    start_nameserver: StartNameServer,
    zookeeper: ZooKeeperServer,
    zk_root: str,
) -> None:
    group = Group(start_broker, zookeeper, zk_root, extra=FAST)
    try:
        group.routed(start_nameserver, TOPIC, 1)
        first = group.master()
        old = group.brokers[first]
        send(old, [f"f{i}".encode() for i in range(10)])
        # Long enough to outlast the election: the holders' handles are still good after it.
        got = sorted(receive(old, invisible_ms=10_000), key=lambda m: m.message.queue_offset)
        assert len(got) == 10
        # SYNC_MASTER: each answered ack is on the in-sync slaves.
        assert codes(ack(old, [m.receipt_handle for m in got[:5]])) == ["OK"] * 5
        group.kill(first)
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        new = group.brokers[second]
        # SYNC_MASTER: acks answer once an in-sync slave holds them (the third broker, once it
        # follows the new master).
        replicas.wait_in_sync(new)
        # The new master decides on the state its predecessor left: acked ones stay acked, the
        # others are still invisible and their holders' handles still work.
        assert codes(ack(new, [got[0].receipt_handle, got[5].receipt_handle])) == [
            "MESSAGE_ALREADY_ACKED",
            "OK",
        ]
        assert receive(new, wait_ms=300) == []
        back = receive_until(new, 4, timeout_s=30)
        assert sorted(m.message.queue_offset for m in back) == [6, 7, 8, 9]
        assert {m.delivery_attempt for m in back} == {2}
        # The receive log has queues but is no topic: the takeover restored no config for it.
        # (The table on disk: its snapshot, topics.json, and the journal of changes since.)
        stored = "".join(p.read_text() for p in (new.store_dir / "config").glob("topics.json*"))
        assert '"topic"' in stored
        assert "%SYS%" not in stored
    finally:
        group.thaw_all()
