"""Receive/ack load through an automatic failover, shared by the SYNC_MASTER and ASYNC_MASTER
tests: members of one or more consumer groups receive (nacking and dropping a few), senders
send, a holder per group keeps a few messages in flight, and the master is SIGKILLed; the run
goes on until the new master acknowledged 100 sends and the members acked what they must."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tests.integration.conftest import NameServerProcess
from tests.integration.failover import SESSION_MS, Group
from tests.integration.receive_cluster import Senders, SendLog, wall_ms
from tests.integration.receivers import (
    Action,
    Delivery,
    DeliveryLog,
    Members,
    Outcome,
    members,
    record_delivery,
    simple_consumer,
    wait_all_done,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2

TOPIC = "orders"
QUEUES = 4
KEYS = [f"k{i}" for i in range(8)]
HOLD_MS = 3_000


def knows_fifo(g: Group, consumer_group: str) -> bool:
    """Every live broker (slaves by config sync) has the group's FIFO setting."""
    for b in g.live().values():
        try:
            r = b.stub().GetConsumerGroup(
                broker_pb2.GetConsumerGroupRequest(group=consumer_group), timeout=5
            )
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # not synced yet
                raise
            return False
        if not r.group.settings.fifo:
            return False
    return True


def light_failures(message: Any) -> tuple[Action, float]:
    """About 10% nacked and 5% dropped on their first delivery, the rest acked."""
    roll = zlib.crc32(message.body + b"#%d" % message.delivery_attempt) % 100
    if message.delivery_attempt == 1 and roll < 10:
        return Action.NACK, 0.0
    if message.delivery_attempt == 1 and roll < 15:
        return Action.DROP, 0.0
    return Action.ACK, 0.0


def hold(ns: str, consumer_group: str, log: DeliveryLog) -> list[Delivery]:
    """A member that takes a few messages and dies with them (never acks): in flight at the
    failover."""
    with simple_consumer(ns, consumer_group, TOPIC) as holder:
        got = holder.receive(max_messages=4, invisible_duration_s=HOLD_MS / 1000, timeout_s=5)
        return [record_delivery(log, f"{consumer_group}-holder", m, HOLD_MS) for m in got]


@dataclass
class FailoverRun:
    sent: SendLog
    logs: dict[str, DeliveryLog]
    consumers: dict[str, Members]
    held: dict[str, list[Delivery]]
    first: int
    second: int = 0
    killed_at: float = 0.0
    failed_over_at: float = 0.0

    def figures(self, name: str, duplicates: int) -> str:
        log = self.logs[name]
        return (
            f"{name}: deliveries {len(log.deliveries())}, duplicates {duplicates}, redelivered"
            f" {sum(d.attempt > 1 for d in log.deliveries())}, held at the kill"
            f" {len(self.held[name])}, member errors {len(self.consumers[name].errors())},"
            f" nacks refused in time {sum(_refused_in_time(d) for d in log.deliveries())}"
        )


def _refused_in_time(d: Delivery) -> bool:
    """A nack refused although it was sent while its handle was valid: a retry (after a lost
    answer) that found the first try's release."""
    return d.outcome is Outcome.NACK_REFUSED and (d.ended_at_ms or 0) < d.invisible_until_ms


def receive_through_failover(
    group: Group,
    ns: NameServerProcess,
    consumer_groups: Sequence[str],
    must_ack: Callable[[FailoverRun], set[str]],
) -> FailoverRun:
    """Load, kill the master, load on the new one; returns once every group acked the bodies
    ``must_ack`` names (asked after the senders stopped)."""
    logs = {name: DeliveryLog() for name in consumer_groups}
    run = FailoverRun(
        SendLog(),
        logs,
        {
            name: members(2, ns.address, name, TOPIC, log, plan=light_failures, invisible_s=2.0)
            for name, log in logs.items()
        },
        {},
        group.master(),
    )
    senders = Senders(ns.address, TOPIC, [KEYS[:4], KEYS[4:]], None, run.sent, interval_s=0.05)
    with contextlib.ExitStack() as running:
        for m in run.consumers.values():
            running.enter_context(m)
        with senders:
            wait_until(
                lambda: (
                    all(m.healthy() for m in run.consumers.values())
                    and all(len(log.done_bodies()) >= 100 for log in logs.values())
                ),
                40,
                "100 acks in each group",
            )
            run.held = {name: hold(ns.address, name, log) for name, log in logs.items()}
            run.killed_at = wall_ms()
            group.kill(run.first)
            run.second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=run.first)
            run.failed_over_at = wall_ms()
            wait_until(
                lambda: senders.healthy() and run.sent.ok_since(run.failed_over_at) >= 100,
                30,
                "100 sends acknowledged by the new master",
            )
        wanted = must_ack(run)
        for name, log in logs.items():
            only = SendLog(ok={b: t for b, t in run.sent.ok.items() if b in wanted})
            wait_all_done(log, only, run.consumers[name], 40, f" by {name}")
    assert run.second != run.first
    return run
