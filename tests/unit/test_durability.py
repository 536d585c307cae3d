"""A send's durability decision (``tidemq.services.broker.durability``, RocketMQ's
handleDiskFlushAndHA) over every combination of role, flush, replication and lease, and the
send handler's waiting that feeds it, without sockets or clocks."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

import grpc
import pytest

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.config import BrokerConfig, BrokerRole
from tidemq.services.broker.convert import SEND_STATUS
from tidemq.services.broker.durability import send_status, waits_for_slaves
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.handlers.send import SendHandler
from tidemq.services.broker.put_waits import wait_durable
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.storage import AppendResult, Message, MessageStore, PutResult, PutStatus

pytestmark = pytest.mark.unit

ASYNC, SYNC = BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER
OK = PutStatus.PUT_OK
DISK_TIMEOUT = PutStatus.FLUSH_DISK_TIMEOUT
SLAVE_TIMEOUT = PutStatus.FLUSH_SLAVE_TIMEOUT
NO_SLAVE = PutStatus.SLAVE_NOT_AVAILABLE

FLUSHES = (OK, DISK_TIMEOUT)
REPLICATIONS = (OK, SLAVE_TIMEOUT, NO_SLAVE)


def answer(role: BrokerRole, flushed: PutStatus, slaves: PutStatus, lease_held: bool) -> object:
    """What a master of ``role`` with a replication side answers, when its disk says
    ``flushed``, its slaves would say ``slaves`` if asked, and its lease at the answer is
    ``lease_held``."""
    replicated = slaves if waits_for_slaves(role, replicating=True) else None
    return send_status(flushed, replicated, may_acknowledge=lease_held)


@pytest.mark.parametrize(
    ("role", "flushed", "slaves", "expected"),
    [
        # An ASYNC_MASTER answers with its flush; the slaves are never asked.
        (ASYNC, OK, OK, OK),
        (ASYNC, OK, SLAVE_TIMEOUT, OK),
        (ASYNC, OK, NO_SLAVE, OK),
        (ASYNC, DISK_TIMEOUT, OK, DISK_TIMEOUT),
        (ASYNC, DISK_TIMEOUT, SLAVE_TIMEOUT, DISK_TIMEOUT),
        (ASYNC, DISK_TIMEOUT, NO_SLAVE, DISK_TIMEOUT),
        # A SYNC_MASTER: the flush's status when the slaves hold the send, else theirs, even
        # over a disk timeout.
        (SYNC, OK, OK, OK),
        (SYNC, OK, SLAVE_TIMEOUT, SLAVE_TIMEOUT),
        (SYNC, OK, NO_SLAVE, NO_SLAVE),
        (SYNC, DISK_TIMEOUT, OK, DISK_TIMEOUT),
        (SYNC, DISK_TIMEOUT, SLAVE_TIMEOUT, SLAVE_TIMEOUT),
        (SYNC, DISK_TIMEOUT, NO_SLAVE, NO_SLAVE),
    ],
)
def test_with_the_lease_held_the_answer_combines_flush_and_replication(
    role: BrokerRole, flushed: PutStatus, slaves: PutStatus, expected: PutStatus
) -> None:
    assert answer(role, flushed, slaves, lease_held=True) is expected


@pytest.mark.parametrize(
    ("role", "flushed", "slaves"), list(itertools.product((ASYNC, SYNC), FLUSHES, REPLICATIONS))
)
def test_a_lease_lapsed_while_waiting_refuses_whatever_the_statuses(
    role: BrokerRole, flushed: PutStatus, slaves: PutStatus
) -> None:
    assert answer(role, flushed, slaves, lease_held=False) is None


@pytest.mark.parametrize(
    ("role", "replicating", "waits"),
    [
        (SYNC, True, True),
        (SYNC, False, False),  # no replication master side: nothing to wait on
        (ASYNC, True, False),
        (ASYNC, False, False),
        (BrokerRole.SLAVE, True, False),
        (BrokerRole.SLAVE, False, False),
    ],
)
def test_only_a_replicating_sync_master_waits_for_its_slaves(
    role: BrokerRole, replicating: bool, waits: bool
) -> None:
    assert waits_for_slaves(role, replicating) is waits


def test_without_replication_the_answer_is_the_flush() -> None:
    for flushed in FLUSHES:
        assert send_status(flushed, None, may_acknowledge=True) is flushed
        assert send_status(flushed, None, may_acknowledge=False) is None


# -- the waiting (put_waits.wait_durable) ----------------------------------------------------


class FakeReplication:
    def __init__(self, status: PutStatus) -> None:
        self.status = status
        self.asked: list[int] = []
        self.meanwhile: Callable[[], object] = lambda: None  # what happens during the wait

    def notify_appended(self) -> None:
        pass

    async def replicate(self, end_offset: int) -> PutStatus:
        self.asked.append(end_offset)
        self.meanwhile()
        return self.status


def put_of(durable: Future[PutStatus]) -> PutResult:
    host = (bytes(4), 0)
    return PutResult(
        [AppendResult(100, 40, 0, 0, host), AppendResult(140, 60, 1, 0, host)], durable
    )


def done(status: PutStatus) -> Future[PutStatus]:
    f: Future[PutStatus] = Future()
    f.set_result(status)
    return f


def complete_soon(f: Future[PutStatus], status: PutStatus) -> None:
    """The flusher's answer, arriving once the waiting has begun."""
    asyncio.get_running_loop().call_soon(f.set_result, status)


@pytest.mark.parametrize("flush_done", [True, False])
@pytest.mark.parametrize(("flushed", "slaves"), list(itertools.product(FLUSHES, REPLICATIONS)))
def test_a_sync_master_waits_for_the_flush_and_the_slaves_up_to_the_batch_end(
    flush_done: bool, flushed: PutStatus, slaves: PutStatus
) -> None:
    repl = FakeReplication(slaves)

    async def scenario() -> tuple[PutStatus, PutStatus | None]:
        durable = done(flushed) if flush_done else Future()
        if not flush_done:
            complete_soon(durable, flushed)
        return await wait_durable(put_of(durable), repl, SYNC)

    assert asyncio.run(scenario()) == (flushed, slaves)
    assert repl.asked == [200]  # the last record's end: 140 + 60


@pytest.mark.parametrize("flush_done", [True, False])
@pytest.mark.parametrize(("role", "replicating"), [(ASYNC, True), (ASYNC, False), (SYNC, False)])
def test_other_masters_wait_for_the_flush_alone(
    flush_done: bool, role: BrokerRole, replicating: bool
) -> None:
    repl = FakeReplication(NO_SLAVE)

    async def scenario() -> tuple[PutStatus, PutStatus | None]:
        durable = done(DISK_TIMEOUT) if flush_done else Future()
        if not flush_done:
            complete_soon(durable, DISK_TIMEOUT)
        return await wait_durable(put_of(durable), repl if replicating else None, role)

    assert asyncio.run(scenario()) == (DISK_TIMEOUT, None)
    assert repl.asked == []


# -- the send handler asks at the answer --------------------------------------------------------


class Aborted(Exception):
    pass


class FakeContext:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def set_trailing_metadata(self, _metadata: object) -> None:
        pass

    async def abort(self, status: grpc.StatusCode, details: str) -> None:
        raise Aborted(status, details)


class FakeStore:
    def put_messages(self, batch: list[Message]) -> PutResult:
        return put_of(done(OK))


async def no_publication() -> None:
    pass


def send(slaves: PutStatus, lease_lapses: bool) -> list[str] | tuple[grpc.StatusCode, str]:
    """A SYNC_MASTER's answer to a send of two messages whose flush is done and whose slaves say
    ``slaves``; with ``lease_lapses`` it stops acknowledging while the slaves are waited for."""
    cfg = BrokerConfig(store_dir="/nonexistent/store", role=SYNC)
    topics = TopicManager(cfg.store_dir)
    topics.topics = {"orders": TopicConfig("orders", 4, 4)}
    role = RoleState.for_config(cfg.role, cfg.broker_id, False, 0)
    repl = FakeReplication(slaves)
    if lease_lapses:
        repl.meanwhile = lambda: setattr(role, "paused", True)  # as a switchover pauses it
    handler = SendHandler(
        BrokerChecks(cfg, topics, role),
        cast(MessageStore, FakeStore()),
        no_publication,
        cast(ReplicationServicer, repl),
        None,
    )
    request = broker_pb2.SendMessageRequest(
        messages=[common_pb2.Message(topic="orders", body=b"x", queue_id=q) for q in (1, 2)]
    )

    async def call() -> Any:
        return await handler.SendMessage(request, FakeContext())

    try:
        response = asyncio.run(call())
    except Aborted as e:
        return e.args[0], e.args[1]
    return [broker_pb2.SendStatus.Name(r.status) for r in response.results]


@pytest.mark.parametrize("slaves", REPLICATIONS)
def test_the_send_handler_asks_with_the_lease_as_it_is_after_the_waits(slaves: PutStatus) -> None:
    assert send(slaves, lease_lapses=False) == [broker_pb2.SendStatus.Name(SEND_STATUS[slaves])] * 2
    status, details = send(slaves, lease_lapses=True)
    assert status == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot acknowledge writes now" in details
