"""A consumer's queue position across a failover, without sockets: a pull task against brokers
that are in-memory queues. Without confirm_offset a consumer reads records only the old master
held; the new master's queue gives their offsets to later sends, and the consumer must read
those sends, not go on past them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tidemq.consumer.config import ConsumerConfig
from tidemq.consumer.lineage import Lineage
from tidemq.consumer.pulling import Puller, QueueState
from tidemq.errors import BrokerUnavailableError, TidemqError
from tidemq.protos import broker_pb2, common_pb2
from tidemq.routes import MessageQueue

MQ = MessageQueue("orders", "broker-a", 0)
OLD, NEW = "127.0.0.1:1001", "127.0.0.1:1002"


def record(offset: int, body: str, host: str) -> common_pb2.StoredMessage:
    """A record as broker ``host`` stored it (its message id names the host and position)."""
    return common_pb2.StoredMessage(
        topic=MQ.topic,
        queue_id=MQ.queue_id,
        queue_offset=offset,
        commitlog_offset=offset * 100,
        body=body.encode(),
        msg_id=f"{host}/{offset * 100}",
        store_timestamp_ms=1_000 + offset,
        born_timestamp_ms=900 + offset,
    )


class FakeRoutes:
    def invalidate(self, topic: str) -> None:
        pass


class FakeBrokers:
    """A broker group: each address's queue, which address the route names, and which
    addresses are down."""

    def __init__(self, queues: dict[str, list[common_pb2.StoredMessage]], read: str) -> None:
        self.queues = queues
        self.read = read
        self.down: set[str] = set()
        self.epochs: dict[str, int] = {}  # each address's log epoch (0: none)
        self.routes = FakeRoutes()

    async def read_address(self, mq: MessageQueue) -> tuple[str, bool]:
        return self.read, True

    async def invoke(
        self, mq: MessageQueue, address: str, method: str, request: object, timeout_s: float
    ) -> broker_pb2.PullMessageResponse:
        assert isinstance(request, broker_pb2.PullMessageRequest)
        await asyncio.sleep(0.001)
        if address in self.down:
            raise BrokerUnavailableError(f"{address} is down", code="UNAVAILABLE")
        queue, epoch = self.queues[address], self.epochs.get(address, 0)
        end, offset = len(queue), request.offset
        if offset > end:
            return broker_pb2.PullMessageResponse(
                status=broker_pb2.OFFSET_OVERFLOW, next_offset=end, max_offset=end, log_epoch=epoch
            )
        if offset == end:
            await asyncio.sleep(0.005)  # the long poll, cut short
            return broker_pb2.PullMessageResponse(
                status=broker_pb2.NO_NEW_MESSAGE,
                next_offset=offset,
                max_offset=end,
                log_epoch=epoch,
            )
        got = queue[offset : offset + request.max_messages]
        return broker_pb2.PullMessageResponse(
            status=broker_pb2.FOUND,
            messages=got,
            next_offset=offset + len(got),
            max_offset=end,
            log_epoch=epoch,
        )


async def bodies_until(st: QueueState, done: Callable[[list[str]], bool]) -> list[str]:
    """What the pull task buffered, once ``done`` holds (looked at for up to 2 s)."""
    for _ in range(1_000):
        bodies = [m.body.decode() for m in st.buffer]
        if done(bodies):
            return bodies
        await asyncio.sleep(0.002)
    raise AssertionError(f"the pull task did not get there; it buffered {bodies}")


async def failover(old: list[str], new: list[str], taken_back: int) -> list[str]:
    """A consumer reads the old master's queue ``old`` (its last ``taken_back`` records never
    reached a slave); the old master dies and the new master's queue is ``new``. Every body
    the consumer buffered, once it is at the new master's end."""
    shared = len(old) - taken_back
    queues = {
        OLD: [record(i, b, OLD) for i, b in enumerate(old)],
        # The new master holds the old one's records byte for byte up to where they part.
        NEW: [record(i, b, OLD) for i, b in enumerate(old[:shared])]
        + [record(shared + i, b, NEW) for i, b in enumerate(new[shared:])],
    }
    assert [m.body.decode() for m in queues[NEW]] == new
    brokers = FakeBrokers(queues, OLD)
    config = ConsumerConfig(long_poll_ms=5)
    errors: list[TidemqError] = []
    puller = Puller("audit", config, brokers, asyncio.Event(), errors.append)  # type: ignore[arg-type]
    st = puller.start(MQ, 0)
    try:
        await bodies_until(st, lambda got: len(got) == len(old))
        brokers.down.add(OLD)
        await asyncio.sleep(0.02)  # a pull or two fails against the dead master
        brokers.read = NEW
        await bodies_until(st, lambda got: st.next_pull == len(new))
        await asyncio.sleep(0.02)  # nothing more comes
        return [m.body.decode() for m in st.buffer]
    finally:
        await puller.stop(st)


def test_sends_given_the_offsets_of_records_a_failover_took_back_are_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # p0:3 and p1:2 reached only the old master; on the new one p1:2 (retried) and p2:0 took
    # offsets 3 and 4 and went on. Going on from offset 5 skipped p2:0 and p1:2's new copy.
    old = ["p0:0", "p1:0", "p0:1", "p0:3", "p1:2"]
    new = ["p0:0", "p1:0", "p0:1", "p1:2", "p2:0", "p0:4"]
    got = asyncio.run(failover(old, new, taken_back=2))
    assert got[:3] == old[:3]
    assert "p2:0" in got, f"the send at the offset a failover took back was skipped: {got}"
    # What it read of the new master, in its order, after the records both hold.
    assert got[-3:] == new[3:]
    assert (
        f"the broker at {NEW} does not hold what this consumer read at queue offset 3 "
        "(a failover took it back); reading again from 3"
    ) in caplog.text


async def cut_in_place(old: list[str], new: list[str], taken_back: int) -> list[str]:
    """A consumer reads the master's queue ``old`` at epoch 2; without a failed pull or a move,
    the same broker's log is cut back by ``taken_back`` records and grows again as ``new`` at
    epoch 3 (a frozen master that thawed and returned as a slave while the route still names
    it). Every body the consumer buffered, once it is at the end of ``new``."""
    shared = len(old) - taken_back
    brokers = FakeBrokers({OLD: [record(i, b, OLD) for i, b in enumerate(old)]}, OLD)
    brokers.epochs[OLD] = 2
    errors: list[TidemqError] = []
    config = ConsumerConfig(long_poll_ms=5)
    puller = Puller("audit", config, brokers, asyncio.Event(), errors.append)  # type: ignore[arg-type]
    st = puller.start(MQ, 0)
    try:
        await bodies_until(st, lambda got: len(got) == len(old))
        brokers.queues[OLD] = [record(i, b, OLD) for i, b in enumerate(old[:shared])] + [
            record(shared + i, f"{b}", NEW) for i, b in enumerate(new[shared:])
        ]
        brokers.epochs[OLD] = 3
        await bodies_until(st, lambda got: st.next_pull == len(new))
        await asyncio.sleep(0.02)  # nothing more comes
        return [m.body.decode() for m in st.buffer]
    finally:
        await puller.stop(st)


def test_a_broker_whose_log_was_cut_back_under_the_consumer_is_read_again_where_it_parted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = ["p0:0", "p1:0", "p0:1", "p0:3", "p1:2"]
    new = ["p0:0", "p1:0", "p0:1", "p1:2", "p2:0", "p0:4"]
    got = asyncio.run(cut_in_place(old, new, taken_back=2))
    assert "p2:0" in got, f"the send at the offset the cut took back was skipped: {got}"
    assert got[-3:] == new[3:]
    assert (
        f"the broker at {OLD} does not hold what this consumer read at queue offset 3 "
        "(a failover took it back); reading again from 3"
    ) in caplog.text


def test_a_new_master_holding_everything_read_is_not_read_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = ["p0:0", "p1:0", "p0:1"]
    new = [*old, "p1:1"]
    assert asyncio.run(failover(old, new, taken_back=0)) == new
    assert "does not hold" not in caplog.text


def test_a_new_master_shorter_than_what_was_read_is_read_from_its_end() -> None:
    # The old master's last two records are gone and nothing new has come yet.
    old = ["p0:0", "p1:0", "p0:1", "p0:2"]
    new = ["p0:0", "p1:0"]
    assert asyncio.run(failover(old, new, taken_back=2)) == new


def test_a_check_steps_back_one_record_at_a_time_and_stops_at_the_oldest_remembered() -> None:
    lineage = Lineage(depth=2)
    lineage.pulled(OLD, [record(i, "x", OLD) for i in range(4)])  # remembers offsets 2 and 3
    lineage.reading_from(NEW)
    assert lineage.checking and lineage.check_offset() == 3
    other = [record(3, "y", NEW)]
    assert lineage.judge(4, broker_pb2.FOUND, other, 9) is None
    assert lineage.check_offset() == 2
    assert lineage.judge(4, broker_pb2.FOUND, [record(2, "y", NEW)], 9) == 2
    assert not lineage.checking and lineage.parted_at == 2
