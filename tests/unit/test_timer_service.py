"""The timer service and its log on a real store, without sockets and with the clock passed in:
firing puts the due messages and their Fired mark in one put and nothing before they are due;
a recalled timer is never delivered; a restart rebuilds the wheel from the %SYS%TIMER queue and
fires only what is still pending; sends made while the wheel is rebuilt are fired once; a slave
that applies the replicated log holds the master's progress."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.protos import common_pb2
from tidemq.services.broker.config import BrokerConfig, BrokerRole
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.retention import wire_retention_floors
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.timer.events import TIMER_LOG_TOPIC, Fired, decode_timer_event
from tidemq.services.broker.timer.journal import TimerJournal
from tidemq.services.broker.timer.recall_handle import RecallHandle
from tidemq.services.broker.timer.service import REBUILD_CHUNK, TimerService
from tidemq.services.broker.timer.wheel import TimerWheel
from tidemq.services.broker.topics import TopicManager
from tidemq.services.errors import ServiceError
from tidemq.storage import Message, MessageStore, PutStatus, StoreConfig, StoredMessage

NOW = 1_700_000_000_000
DAY_MS = 86_400_000


def open_store(root: Path) -> MessageStore:
    return MessageStore(
        StoreConfig(
            str(root),
            commitlog_file_size_bytes=64 << 10,
            consume_queue_entries_per_file=1000,
            index_slot_num=100,
            index_max_num=400,
            # Retention passes may run any hour (the test ages the files).
            delete_when_hours=tuple(range(24)),
        )
    ).open()


class Broker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = open_store(root / "store")
        self.journal = TimerJournal(self.store)
        self.journal.open()
        self.wheel = TimerWheel(str(root / "timer"))
        role = RoleState.for_config(BrokerRole.ASYNC_MASTER, 0, False, 0)
        config = BrokerConfig(store_dir=str(root))
        checks = BrokerChecks(config, TopicManager(str(root)), role)
        self.service = TimerService(
            "broker-a", self.store, self.journal, self.wheel, checks, 40 * DAY_MS
        )
        # As the broker wires them (server.py).
        wire_retention_floors(
            self.store,
            lambda: None,
            OffsetManager(str(root)),
            pinned=(self.journal.low_position, self.journal.newest_position),
        )

    def close(self) -> None:
        self.wheel.close()
        self.store.close()

    def send(self, body: bytes, delay_ms: int, now: int = NOW) -> RecallHandle:
        wire = common_pb2.Message(topic="orders", queue_id=1, body=body, delay_ms=delay_ms)
        batch = [Message("orders", body, 1, "t", ("k",), {"UNIQ_KEY": body.decode()})]
        delayed = self.service.scheduling.prepare([wire], batch, now)
        assert delayed
        put = self.store.put_messages(batch)
        self.service.scheduling.stored(delayed, put)
        self.settle(put)
        return RecallHandle("broker-a", "orders", put.results[0].phy_offset, now + delay_ms)

    def settle(self, put: object) -> None:
        assert put.wait(10) is PutStatus.PUT_OK  # type: ignore[attr-defined]
        assert self.store.wait_dispatched(self.store.log.max_offset, 10)

    def fire(self, now: int) -> list[StoredMessage]:
        put, _ = self.service.fire(now)
        if put is None:
            return []
        self.settle(put)
        return [self.store.look_message(r.phy_offset) for r in put.results]

    def delivered(self) -> list[bytes]:
        got = self.store.get_messages("orders", 1, 0, 100).messages
        return [m.body for m in got]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    asyncio.run(b.service.lead())
    yield b
    b.close()


def test_firing_puts_the_due_messages_then_their_fired_mark_and_nothing_before_due(
    broker: Broker,
) -> None:
    broker.send(b"a", 1_000)
    broker.send(b"b", 5_000)
    assert broker.fire(NOW + 999) == []
    assert broker.delivered() == []
    real, mark = broker.fire(NOW + 1_000)
    assert (real.topic, real.queue_id, real.body, real.tags, real.keys) == (
        "orders",
        1,
        b"a",
        "t",
        ["k"],
    )
    assert real.properties["UNIQ_KEY"] == "a"
    assert real.properties["TIMER_DELIVER_MS"] == str(NOW + 1_000)
    assert "REAL_TOPIC" not in real.properties and "REAL_QID" not in real.properties
    assert mark.topic == TIMER_LOG_TOPIC and mark.phy_offset > real.phy_offset
    assert decode_timer_event(mark.body) == Fired(NOW + 1_000, 1)
    assert broker.journal.progress.delivered_up_to_ms == NOW + 1_000
    assert broker.fire(NOW + 4_999) == []  # nothing due: nothing appended
    assert [m.body for m in broker.fire(NOW + 60_000)][:1] == [b"b"]
    assert broker.delivered() == [b"a", b"b"]
    assert broker.journal.progress.low_seq == 2


def test_a_recalled_timer_is_never_delivered_and_recalls_of_what_is_not_pending_are_refused(
    broker: Broker,
) -> None:
    a = broker.send(b"a", 1_000)
    b = broker.send(b"b", 2_000)
    msg_id = asyncio.run(broker.service.recall("orders", a.encode()))
    assert msg_id
    with pytest.raises(ServiceError) as again:
        asyncio.run(broker.service.recall("orders", a.encode()))
    assert again.value.code == common_pb2.DELAYED_MESSAGE_NOT_FOUND
    broker.fire(NOW + 10_000)
    assert broker.delivered() == [b"b"]
    with pytest.raises(ServiceError) as late:
        asyncio.run(broker.service.recall("orders", b.encode()))
    assert late.value.code == common_pb2.DELAYED_MESSAGE_NOT_FOUND
    forged = RecallHandle("broker-a", "orders", b.timer_id, b.deliver_at_ms + 1)
    with pytest.raises(ServiceError) as wrong:
        asyncio.run(broker.service.recall("orders", forged.encode()))
    assert wrong.value.code == common_pb2.DELAYED_MESSAGE_NOT_FOUND
    with pytest.raises(ServiceError) as other:
        asyncio.run(broker.service.recall("payments", b.encode()))
    assert other.value.code == common_pb2.INVALID_ARGUMENT


def test_a_restart_rebuilds_the_wheel_and_fires_only_what_is_still_pending(tmp_path: Path) -> None:
    first = Broker(tmp_path)
    asyncio.run(first.service.lead())
    first.send(b"a", 1_000)
    first.send(b"b", 5_000)
    c = first.send(b"c", 9_000)
    asyncio.run(first.service.recall("orders", c.encode()))
    first.fire(NOW + 1_000)
    first.close()
    again = Broker(tmp_path)
    try:
        asyncio.run(again.service.lead())
        assert again.wheel.pending_count == 1
        assert again.journal.progress.delivered_up_to_ms == NOW + 1_000
        again.fire(NOW + 60_000)
        assert again.delivered() == [b"a", b"b"]
    finally:
        again.close()


def test_sends_made_before_the_wheel_is_rebuilt_are_fired_once(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    try:
        b.send(b"early", 1_000)  # the service has not led yet: held
        asyncio.run(b.service.lead())
        assert b.wheel.pending_count == 1
        b.fire(NOW + 1_000)
        assert b.delivered() == [b"early"]
    finally:
        b.close()


def test_a_slave_applying_the_replicated_log_holds_the_masters_progress(
    broker: Broker, tmp_path: Path
) -> None:
    broker.send(b"a", 1_000)
    r = broker.send(b"b", 5_000)
    broker.send(b"c", 7_000)
    asyncio.run(broker.service.recall("orders", r.encode()))
    broker.fire(NOW + 1_000)
    slave = open_store(tmp_path / "slave")
    try:
        follower = TimerJournal(slave)
        follower.open()
        end = broker.store.log.max_offset
        slave.append_raw(0, broker.store.read_raw(0, end))
        assert slave.wait_dispatched(end, 10)
        while follower.catch_up(16):
            pass
        assert follower.progress == broker.journal.progress
        assert follower.progress.is_recalled(r.timer_id)
    finally:
        slave.close()


def age_commitlog(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for name in os.listdir(root / "commitlog"):
        os.utime(root / "commitlog" / name, (past, past))


def test_retention_keeps_a_pending_timer_record_and_the_log_it_needs_whatever_their_age(
    tmp_path: Path,
) -> None:
    b = Broker(tmp_path)
    asyncio.run(b.service.lead())
    b.send(b"soon", 1_000)
    b.send(b"far", 30 * DAY_MS)
    b.fire(NOW + 1_000)
    # Enough later traffic to fill many CommitLog files, then every file is past retention.
    for _ in range(60):
        b.settle(b.store.put_messages([Message("other", b"x" * 4_000, 0)]))
    b.fire(NOW + 2_000)  # nothing due: appends nothing
    files = len(b.store.commitlog.mfq.files)
    age_commitlog(tmp_path / "store", 100 * 3600)
    while b.store.run_retention():
        pass
    assert len(b.store.commitlog.mfq.files) == files  # the far timer sits in the first file
    b.close()
    again = Broker(tmp_path)
    try:
        asyncio.run(again.service.lead())
        assert again.wheel.pending_count == 1
        again.fire(NOW + 30 * DAY_MS)
        assert again.delivered() == [b"soon", b"far"]
        # Nothing pending any more: retention may take the old files now.
        age_commitlog(tmp_path / "store", 100 * 3600)
        deleted = 0
        while n := again.store.run_retention():
            deleted += n
        assert deleted > 0
    finally:
        again.close()


def test_a_send_made_while_a_long_rebuild_runs_is_fired_exactly_once(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    try:
        n = REBUILD_CHUNK * 2 + 10  # the rebuild takes several loop steps
        for start in range(0, n, 512):
            count = min(512, n - start)
            wire = [common_pb2.Message(topic="orders", queue_id=1, delay_ms=1_000)] * count
            batch = [Message("orders", f"m{start + i}".encode(), 1) for i in range(count)]
            delayed = b.service.scheduling.prepare(wire, batch, NOW)
            assert delayed
            b.store.put_messages(batch)  # before the service leads: the scan finds them
        b.settle(b.store.put_messages([Message("other", b"x", 0)]))

        async def rebuild_with_a_send_in_between() -> None:
            lead = asyncio.create_task(b.service.lead())
            # One loop step at a time until the rebuild has begun (no clock involved).
            while b.wheel.pending_count == 0:  # noqa: ASYNC110 - stepping the loop, not polling
                await asyncio.sleep(0)
            assert not lead.done()
            b.send(b"during", 2_000)
            await lead

        asyncio.run(rebuild_with_a_send_in_between())
        assert b.wheel.pending_count == n + 1
        while b.fire(NOW + 10_000):
            pass
        got = b.store.get_messages("orders", 1, 0, 4 * n, 64 << 20).messages
        bodies = [m.body for m in got]
        assert len(bodies) == n + 1 == len(set(bodies))
        assert b"during" in bodies
    finally:
        b.close()


def test_a_timer_due_before_dispatch_published_its_record_is_fired_once_it_has(
    broker: Broker,
) -> None:
    """Under SYNC flush dispatch waits for the flush, so a short delay can fall due before
    its record is readable: it waits for a later tick, it is not dropped."""
    wire = common_pb2.Message(topic="orders", queue_id=1, body=b"soon", delay_ms=5)
    batch = [Message("orders", b"soon", 1, None, (), {})]
    with broker.store.dispatch_held():  # dispatch lags behind the put
        delayed = broker.service.scheduling.prepare([wire], batch, NOW)
        assert delayed
        put = broker.store.put_messages(batch)
        broker.service.scheduling.stored(delayed, put)
        nothing, _ = broker.service.fire(NOW + 10)
        assert nothing is None
    broker.settle(put)
    assert [m.body for m in broker.fire(NOW + 20)][:1] == [b"soon"]
    assert broker.delivered() == [b"soon"]
