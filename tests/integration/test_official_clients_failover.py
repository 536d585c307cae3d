"""The official RocketMQ 5 clients through an automatic failover: a group of three brokers on a
real ZooKeeper, each serving ``apache.rocketmq.v2`` on its own listener; one process of the
official client (Python, then Node.js, each unmodified in its own environment) keeps sending
numbered messages with a Producer and receiving and acking them with a SimpleConsumer. The
master is killed with SIGKILL mid-stream. Without a restart, the same process's sends are
acknowledged again, by the new master, and its consumer receives every message a send was
acknowledged for (at least once: a message received but not acked before the kill comes back).

How long a client takes to follow is its own route refresh: neither client asks for routes
again when a broker fails, only on its timer (30 s; the Python client's first one 10 s after it
starts), and nothing in the protocol lets a broker make it ask sooner. The Node.js client's
Producer (1.0.8) never takes a refreshed route (its queues are those of its first send), so the
Node.js application does what one must with it: after ten failed sends in a row it replaces its
Producer, in the same process; its SimpleConsumer follows by itself (docs/rocketmq-clients.md,
"Failover")."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.integration.conftest import StartNameServer, free_port
from tests.integration.failover import (
    SESSION_MS,
    Group,
    group_fixture,  # noqa: F401 - the group fixture
)
from tests.integration.official_clients import (  # noqa: F401 - the fixtures
    client_fixture,
    programs_fixture,
)
from tests.interop.clients import PYTHON, Event, OfficialClient, Program, Programs

pytestmark = pytest.mark.integration

TOPIC, GROUP, QUEUES = "payments", "ledger", 2
# The client's route refresh period, the election, and a margin for a loaded machine.
ROUTE_REFRESH_S = 30
FOLLOW_TIMEOUT_S = ROUTE_REFRESH_S + SESSION_MS / 1000 + 13
PLAN = {
    "topic": TOPIC,
    "group": GROUP,
    "await_s": 2,
    # Short: a message received from the old master and not acked comes back soon.
    "invisible_s": 5,
    "send_interval_ms": 50,
    "error_pause_ms": 200,
}
# Sends failed in a row after which the application replaces its Producer: never with Python.
RENEW_PRODUCER_AFTER_FAILURES = {"python": 0, "node": 10}


def access_point(client: OfficialClient, v2: dict[int, str], master: int) -> str:
    """Python: every broker of the group (the client's channel moves to the next address when
    one dies). Node.js: one surviving broker, as its 1.0.8 takes a single address (a list does
    not resolve in its gRPC channel); in production, a load balancer or Kubernetes Service."""
    if client is PYTHON:
        return ";".join(v2[i] for i in sorted(v2))
    return v2[min(i for i in v2 if i != master)]


def sent(p: Program) -> list[Event]:
    return p.of("sent")


def through(events: list[Event], endpoint: str) -> list[Event]:
    return [e for e in events if e["endpoint"] == endpoint]


def test_a_client_producing_and_consuming_follows_the_new_master_and_loses_nothing_acknowledged(
    client: OfficialClient,
    group: Group,
    start_nameserver: StartNameServer,
    programs: Programs,
) -> None:
    v2 = {i: f"127.0.0.1:{free_port()}" for i in (1, 2, 3)}
    group.routed(
        start_nameserver,
        TOPIC,
        QUEUES,
        own_flags={i: ("--rocketmq-listen", address) for i, address in v2.items()},
    )
    first = group.master()
    p = programs.start(
        "failover_client",
        {
            "endpoints": access_point(client, v2, first),
            "renew_producer_after_failures": RENEW_PRODUCER_AFTER_FAILURES[client.name],
            **PLAN,
        },
    )
    p.wait_for("its consumer in the group", lambda p: bool(p.of("started")), 30)
    p.wait_for(
        "sends acknowledged and received",
        lambda p: len(sent(p)) >= 30 and len(p.of("received")) >= 10,
        30,
    )

    group.kill(first)
    killed_ms = time.time() * 1000
    second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
    assert second != first
    assert group.failover(second).group_epoch == 2
    old, new = v2[first], v2[second]

    p.wait_for(
        "a send acknowledged by the new master",
        lambda p: bool(through(sent(p), new)),
        FOLLOW_TIMEOUT_S,
    )
    p.wait_for("more sends through it", lambda p: len(through(sent(p), new)) >= 20, 20)
    p.tell("stop_producing")
    p.wait_for("the producer to stop", lambda p: bool(p.of("producing_stopped")), 20)
    acknowledged = {e["message_id"]: e["body"] for e in sent(p)}
    p.wait_for(
        "every acknowledged message received",
        lambda p: set(acknowledged) <= {e["message_id"] for e in p.of("received")},
        FOLLOW_TIMEOUT_S,
    )
    events = p.finish()  # exit 0 and "done": one process all along

    assert len([e for e in events if e["event"] == "started"]) == 1
    before = [e for e in sent(p) if e["at_ms"] < killed_ms - 1000]
    after = [e for e in sent(p) if e["at_ms"] > killed_ms + 1000]
    assert before and {e["endpoint"] for e in before} == {old}
    # Nothing acknowledged by the dead master once it was gone; the new one answers.
    assert after and {e["endpoint"] for e in after} == {new}
    received = [e for e in events if e["event"] == "received"]
    assert through(received, new), "nothing was received from the new master"
    # At least once, each with the body its send carried.
    bodies = {e["message_id"]: e["body"] for e in received}
    assert {m: bodies[m] for m in acknowledged} == acknowledged
    followed_ms = min(e["at_ms"] for e in through(sent(p), new)) - killed_ms
    consumed_ms = min(e["at_ms"] for e in through(received, new)) - killed_ms
    copies = Counter(e["message_id"] for e in received)
    print(
        f"{client.name}: {len(acknowledged)} sends acknowledged "
        f"({len(p.of('send_error'))} refused meanwhile, producer replaced "
        f"{len(p.of('producer_renewed'))} times); first send through the new master "
        f"{followed_ms / 1000:.1f} s after the kill, first receive {consumed_ms / 1000:.1f} s; "
        f"{sum(n - 1 for n in copies.values())} duplicate deliveries "
        f"of {sum(1 for n in copies.values() if n > 1)} messages"
    )
