"""A broker whose disk fails: real broker processes with the ``diskfault`` shim below them (an
EIO from fdatasync, armed while they run), a real nameserver, a real ZooKeeper group.

What an operator and a client rely on: the send the disk failed gets a typed, retriable error
(the SDK sends it to another group); the broker says NOT_SERVING, leaves the routes and, under
automatic failover, hands mastership to an in-sync slave within the failover bound; the metrics
and one ERROR line say why; a restart on a repaired disk serves every acknowledged message.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

import tidemq
from tests.faults.disk import DiskFault, fill, small_disk
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.integration.failover import (
    LEASE_MS,
    Group,
    History,
    Producers,
    check_history,
    group_fixture,  # noqa: F401 - the group fixture
)
from tests.integration.replicas import pull_queue, send
from tests.integration.test_broker_operations import sample, scrape
from tests.waiting import wait_until
from tidemq import health
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration

BROKER_SERVICE = "tidemq.v1.Broker"
QUEUES = 2


def flush_fails(fault: DiskFault, b: BrokerProcess) -> None:
    """The disk under the broker's CommitLog fails every flush from now on."""
    commitlog = b.store_dir / "commitlog"
    fault.arm("fdatasync", "EIO", commitlog)
    fault.arm("msync", "EIO", commitlog)


def typed(e: grpc.RpcError) -> Any:
    """The typed ErrorDetail the broker attached to a refusal (it always attaches one)."""
    detail = detail_from_metadata(e.trailing_metadata())
    assert detail is not None, f"an untyped refusal: {e}"
    return detail


def write_masters(ns: NameServerProcess, topic: str) -> set[str]:
    """The addresses the nameserver offers producers of ``topic`` (masters with a route)."""
    with tidemq.Admin(ns.address) as admin:
        try:
            route = admin.route(topic)
        except tidemq.errors.TidemqError:
            return set()  # no broker serves the topic any more
    groups = {q.broker_name for q in route.write_queues}
    return {a for name in groups if (a := route.groups[name].master) is not None}


def error_lines(b: BrokerProcess) -> list[str]:
    return [line for line in b.log().splitlines() if " ERROR " in line]


def test_a_master_whose_disk_fails_a_flush_answers_retriably_steps_aside_and_recovers_on_restart(
    start_broker: StartBroker, nameserver: NameServerProcess, tmp_path: Path
) -> None:
    fault = DiskFault(tmp_path / "diskfault")
    metrics = f"127.0.0.1:{free_port()}"
    flags = ("--nameserver", nameserver.address, "--flush", "SYNC", "--register-interval-ms", "500")
    with fault.below():
        b = start_broker(*flags, "--metrics-listen", metrics)
    with tidemq.Admin(nameserver.address) as admin:
        admin.create_topic("orders", queues=QUEUES)
    wait_until(lambda: bool(write_masters(nameserver, "orders")), 20, "the route to the broker")
    acknowledged = set()
    for i in range(20):
        r = send(b, f"before-{i}".encode(), queue_id=i % QUEUES)
        assert r.status == broker_pb2.SEND_OK
        acknowledged.add(f"before-{i}".encode())
    assert health.check(b.address) == "SERVING"

    flush_fails(fault, b)
    with pytest.raises(grpc.RpcError) as failed:
        send(b, b"the disk fails this one")
    detail = typed(failed.value)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert detail.code == common_pb2.STORE_NOT_WRITABLE and detail.retriable
    assert "EIO" in detail.message, detail.message

    # Steps aside: NOT_SERVING to every probe, out of the routes; later sends are refused too.
    wait_until(
        lambda: health.check(b.address) == health.check(b.address, BROKER_SERVICE) == "NOT_SERVING",
        10,
        "health to say NOT_SERVING",
    )
    wait_until(
        lambda: b.address not in write_masters(nameserver, "orders"), 10, "the route to drop it"
    )
    with pytest.raises(grpc.RpcError) as later:
        send(b, b"after the failure")
    assert typed(later.value).code == common_pb2.STORE_NOT_WRITABLE
    samples = scrape(metrics)
    assert sample(samples, "tidemq_store_failed", reason="disk_io") == 1.0
    assert sample(samples, "tidemq_store_writable") == 0.0
    errors = error_lines(b)
    assert len(errors) == 1 and "store failed (disk_io)" in errors[0], errors

    # The disk is repaired (the shim gone): a restart recovers, serves everything acknowledged
    # and is routed again.
    fault.clear()
    assert b.terminate() == 0
    b = start_broker(*flags, port=int(b.address.rsplit(":", 1)[1]))
    served = {body for q in range(QUEUES) for _, body in pull_queue(b, q)}
    assert acknowledged <= served, sorted(acknowledged - served)[:5]
    assert send(b, b"after the repair").status == broker_pb2.SEND_OK
    wait_until(lambda: b.address in write_masters(nameserver, "orders"), 20, "the route again")
    assert health.check(b.address) == "SERVING"


FAILOVER_BOUND_S = LEASE_MS / 1000 + 2.0  # the goal: the failover lease plus 2 s


def test_a_master_whose_disk_fails_hands_over_to_an_in_sync_slave_within_the_failover_bound(
    group: Group, start_nameserver: StartNameServer, tmp_path: Path
) -> None:
    """Three brokers under automatic failover (SYNC_MASTER, sync flush), all with the shim below
    them; the master's disk fails a flush under producer load. Timed from arming the fault to
    the first send another broker stores (SEND_OK once its slaves have relinked)."""
    fault = DiskFault(tmp_path / "diskfault")
    with fault.below():
        ns = group.routed(start_nameserver, "orders", QUEUES, "--flush", "SYNC")
    first = group.master()
    history = History()

    def stored_elsewhere() -> list[float]:
        """When another broker stored a send (SEND_OK, or stored while its slaves relink)."""
        return [a.at for a in history.answers if a.at > failed_at and a.broker not in ("", old)]

    old = group.brokers[first].address
    with Producers(ns, "orders", history) as producers:
        producers.wait_acknowledged(30)
        flush_fails(fault, group.brokers[first])
        failed_at = time.monotonic()
        wait_until(lambda: bool(stored_elsewhere()), FAILOVER_BOUND_S + 20, "a new master")
        producers.wait_acknowledged(len(history.acknowledged()) + 20)
    took_s = min(stored_elsewhere()) - failed_at
    acked_s = min(a.at for a in history.acknowledged() if a.at > failed_at and a.broker != old)
    print(
        f"disk failure to writes stored by the new master: {took_s:.2f} s, to SEND_OK: "
        f"{acked_s - failed_at:.2f} s (bound {FAILOVER_BOUND_S:.1f} s)"
    )
    assert took_s <= FAILOVER_BOUND_S
    second = group.master(not_id=first)
    assert group.failover(second).group_epoch == 2
    assert health.check(old) == "NOT_SERVING"
    # A send flushed just before the fault may be answered just after it: one per producer at
    # most, and none once the new master stores writes.
    late = [a for a in history.acknowledged() if a.broker == old and a.at > failed_at]
    assert len(late) <= 2 and all(a.at < failed_at + took_s for a in late), late
    # Repaired and restarted, it rejoins as a slave; nothing acknowledged was lost anywhere.
    fault.clear()
    group.brokers[first].terminate()
    group.start(first)
    group.wait_isr({1, 2, 3})
    check_history(history, group, "orders", QUEUES)


def test_a_broker_whose_queue_disk_is_full_never_acknowledges_what_consumers_cannot_see(
    start_broker: StartBroker, nameserver: NameServerProcess, tmp_path: Path
) -> None:
    """Async flush, so no send waits for the disk: a send is answered SEND_OK only once its
    message is in its ConsumeQueue. The ConsumeQueues live on a small tmpfs that fills up."""
    metrics = f"127.0.0.1:{free_port()}"
    with small_disk(tmp_path / "broker" / "consumequeue", 1 << 20) as queues:
        b = start_broker("--nameserver", nameserver.address, "--metrics-listen", metrics)
        try:
            with tidemq.Admin(nameserver.address) as admin:
                admin.create_topic("orders", queues=QUEUES)
            acknowledged = set()
            for i in range(10):
                assert send(b, f"before-{i}".encode(), queue_id=0).status == broker_pb2.SEND_OK
                acknowledged.add(f"before-{i}".encode())
            filler = fill(queues)
            answers = [_answer(b, f"full-{i}".encode(), queue_id=1) for i in range(10)]
            # Queue 1 needs its first file, for which there is no room: the first send is stored
            # but not dispatchable, and the others are refused while dispatch waits for space.
            full = (grpc.StatusCode.RESOURCE_EXHAUSTED, common_pb2.DISK_FULL, True)
            assert answers == [full] * 10
            assert sample(scrape(metrics), "tidemq_store_dispatch_disk_full") == 1.0

            filler.unlink()  # space returns; nothing restarts
            wait_until(lambda: _sent(b, b"after"), 20, "a send to be acknowledged again")
            acknowledged.add(b"after")
            served = {body for q in range(QUEUES) for _, body in pull_queue(b, q)}
            assert acknowledged <= served, sorted(acknowledged - served)[:5]
            log = b.log()
            assert "disk full" in log and "corrupt" not in log.lower()
        finally:
            b.terminate()  # before the tmpfs goes


def _answer(b: BrokerProcess, body: bytes, queue_id: int) -> tuple[object, int, bool]:
    """(gRPC status, ErrorCode, retriable) of one send; (OK, 0, False) when acknowledged."""
    try:
        r = send(b, body, queue_id=queue_id)
    except grpc.RpcError as e:
        detail = typed(e)
        return e.code(), detail.code, detail.retriable
    return grpc.StatusCode.OK, 0, r.status != broker_pb2.SEND_OK


def _sent(b: BrokerProcess, body: bytes) -> bool:
    try:
        return bool(send(b, body, queue_id=1).status == broker_pb2.SEND_OK)
    except grpc.RpcError:
        return False
