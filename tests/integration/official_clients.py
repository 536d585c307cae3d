"""What the official RocketMQ clients' tests check, whichever client runs (each test file runs
these with its own client: tests/interop/clients.py). A real nameserver and broker serving
``apache.rocketmq.v2`` on ``--rocketmq-listen``; the client programs in their own processes and
environments; tidemq's SDK and Admin in the test process to send, receive and look at the
group's state from the other side.

A receive group starts at the end of each queue it first receives from (as RocketMQ's proxy
does), so a consumer joins (``consuming``: its first receive made the group's queue states)
before the messages it must see are sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tidemq
from tests.integration.conftest import BrokerProcess, NameServerProcess
from tests.integration.receive_sdk_helpers import _receive_n
from tests.integration.rocketmq_v2 import shared_cluster
from tests.integration.test_sdk import _routable
from tests.interop.clients import NODE, PYTHON, ROOT, Event, OfficialClient, Program, Programs
from tests.waiting import wait_until

QUEUES = 2
EXAMPLES = ROOT / "docs" / "examples"
# A transaction left open is checked after 2 s (a commit or rollback sent at once is never
# raced by a check), then every 500 ms.
TRANSACTION_CHECKS = ("--transaction-timeout-ms", "2000", "--transaction-check-interval-ms", "500")


@dataclass
class V2Cluster:
    nameserver: NameServerProcess
    broker: BrokerProcess
    endpoints: str  # the broker's apache.rocketmq.v2 address: what a client is configured with
    admin: tidemq.Admin  # tidemq's own, through the nameserver

    def plan(self, **fields: Any) -> dict[str, Any]:
        return {"endpoints": self.endpoints, **fields}

    def topic(self, topic: str, group: str | None = None, **group_settings: Any) -> None:
        self.admin.create_topic(topic, queues=QUEUES)
        if group is not None:
            self.admin.update_consumer_group(group, **group_settings)

    def receive_state(self, group: str, topic: str) -> Any:
        return self.admin.receive_state(group, topic)

    def joined(self, group: str, topic: str) -> bool:
        return len(self.receive_state(group, topic).queues) == QUEUES

    def settled(self, group: str, topic: str) -> bool:
        """Every message of the topic acked (or dead-lettered) by the group, none in flight."""
        queues = self.receive_state(group, topic).queues
        return len(queues) == QUEUES and all(q.lag == 0 for q in queues)


@contextmanager
def v2_cluster(tmp: Path) -> Iterator[V2Cluster]:
    """A nameserver and a master serving the RocketMQ 5 protocol, routed, for a whole test module
    (each test uses its own topics and groups)."""
    with shared_cluster(tmp, *TRANSACTION_CHECKS, topics={}) as (ns, broker):
        _routable(ns.address)
        with tidemq.Admin(ns.address) as admin:
            yield V2Cluster(ns, broker, broker.rocketmq_address, admin)


# Fixtures for a test module to import: each official client in turn (a test using them runs
# once per client), and the test's programs with that client.
@pytest.fixture(name="client", params=[PYTHON, NODE], ids=lambda c: c.name)
def client_fixture(request: pytest.FixtureRequest) -> OfficialClient:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(name="programs")
def programs_fixture(client: OfficialClient, tmp_path: Path) -> Iterator[Programs]:
    with client_programs(client, tmp_path) as p:
        yield p


@contextmanager
def client_programs(client: OfficialClient, tmp_path: Path) -> Iterator[Programs]:
    """The test's programs; their output and logs are printed at the end (pytest shows them
    when the test failed), and what still runs is killed."""
    programs = Programs(client, tmp_path / "clients")
    try:
        yield programs
    finally:
        programs.close()
        for p in programs.started:
            print(p.diagnostics())


def of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e["event"] == kind]


def sent_ids(events: list[Event]) -> dict[str, str]:
    """Body -> message id of every send; a send error fails the test with the error."""
    errors = of(events, "send_error")
    assert not errors, errors
    return {e["body"]: e["message_id"] for e in of(events, "sent")}


def consuming(v2: V2Cluster, programs: Programs, group: str, topic: str, **plan: Any) -> Program:
    """A SimpleConsumer program that has joined its group (its first receive is under way)."""
    p = programs.start("simple_consumer", v2.plan(group=group, topic=topic, **plan))
    p.wait_for("the group's queues", lambda _: v2.joined(group, topic), 30)
    return p


def produce(
    v2: V2Cluster, programs: Programs, topic: str, messages: list[dict[str, Any]]
) -> dict[str, str]:
    return sent_ids(programs.run("producer", v2.plan(topic=topic, messages=messages)))


def tidemq_consumer(v2: V2Cluster) -> dict[str, Any]:
    """tidemq's own SimpleConsumer on the same cluster (through the nameserver, tidemq's
    protocol), from the start of the topic."""
    return {
        "nameserver": v2.nameserver.address,
        "config": tidemq.SimpleConsumerConfig(start_from="first"),
    }


def ended(p: Program) -> list[Event]:
    p.wait_for("its end", lambda p: p.proc.poll() is not None, 60)
    return p.finish()


# --- the scenarios ---------------------------------------------------------------------------


def tag_keys_and_properties(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("orders", "billing")
    consumer = consuming(
        v2, programs, "billing", "orders", tag="created", await_s=2,
        rounds=[
            {"count": 1, "invisible_s": 30, "ack": True, "timeout_s": 30},
            # The other tag was never delivered, the acked message is not again.
            {"count": 0, "invisible_s": 30, "ack": True, "timeout_s": 3},
        ],
    )  # fmt: skip
    before_ms = time.time() * 1000
    ids = produce(v2, programs, "orders", [
        {"body": "order-1", "tag": "created", "keys": ["order-1", "cust-9"],
         "properties": {"source": "interop", "region": "eu"}},
        {"body": "order-2", "tag": "updated"},
    ])  # fmt: skip
    events = ended(consumer)
    received = of(events, "received")
    assert [(m["round"], m["body"]) for m in received] == [(0, "order-1")]
    m = received[0]
    assert m["message_id"] == ids["order-1"]
    assert (m["topic"], m["tag"], m["keys"]) == ("orders", "created", ["cust-9", "order-1"])
    assert m["properties"] == {"source": "interop", "region": "eu"}
    assert (m["delivery_attempt"], m["corrupted"]) == (1, False)
    # Born before it was received; the clients send born time in whole seconds.
    assert before_ms - 1000 <= m["born_timestamp_ms"] <= m["received_at_ms"]
    assert [a["message_id"] for a in of(events, "acked")] == [ids["order-1"]]
    assert not of(events, "error")


def fifo_in_order(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("ledger", "posting", fifo=True)
    consumer = consuming(
        v2, programs, "posting", "ledger", await_s=2,
        rounds=[{"count": 8, "invisible_s": 30, "ack": True, "timeout_s": 40}],
    )  # fmt: skip
    messages = [
        {"body": f"{g}:{i}", "message_group": g} for i in range(4) for g in ("acct-1", "acct-2")
    ]
    ids = produce(v2, programs, "ledger", messages)
    received = of(ended(consumer), "received")
    assert sorted(m["message_id"] for m in received) == sorted(ids.values())
    for g in ("acct-1", "acct-2"):
        mine = [m for m in received if m["message_group"] == g]
        assert [m["body"] for m in mine] == [f"{g}:{i}" for i in range(4)]


def delayed_not_before_its_time(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("reminders", "notifier")
    consumer = consuming(
        v2, programs, "notifier", "reminders", await_s=2,
        rounds=[{"count": 1, "invisible_s": 30, "ack": True, "timeout_s": 40}],
    )  # fmt: skip
    deliver_at_ms = int(time.time() * 1000) + 4000
    sent = programs.run(
        "producer",
        v2.plan(topic="reminders", messages=[{"body": "later", "deliver_at_ms": deliver_at_ms}]),
    )
    sent_ids(sent)
    promised = of(sent, "sent")[0]["deliver_at_ms"]  # the client's own rounding
    assert promised >= deliver_at_ms
    received = of(ended(consumer), "received")
    assert [m["body"] for m in received] == ["later"]
    # The consumer was polling all along: the message came when it was due, not before.
    assert received[0]["received_at_ms"] >= promised
    assert received[0]["delivery_timestamp_ms"] == promised


def transactions_commit_rollback_and_check(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("payments", "settlement")
    messages = [
        {"body": "tx-commit", "transaction": "commit"},
        {"body": "tx-rollback", "transaction": "rollback"},
        {"body": "tx-open", "transaction": "open"},
    ]
    plan = v2.plan(topic="payments", checker="commit", stay=True, messages=messages)
    producer = programs.start("producer", plan)
    # Nobody ends tx-open: the broker asks the producer, whose checker commits it.
    producer.wait_for("a check of tx-open", lambda p: bool(p.of("checked")), 30)
    events = producer.finish()
    ids = sent_ids(events)
    assert all(e["transaction_id"] for e in of(events, "sent"))
    assert {(e["body"], e["resolution"]) for e in of(events, "ended")} == {
        ("tx-commit", "commit"), ("tx-rollback", "rollback"),
    }  # fmt: skip
    checked = of(events, "checked")
    assert {(e["body"], e["message_id"]) for e in checked} == {("tx-open", ids["tx-open"])}
    # Committed by the client or by the check: visible once; rolled back: never.
    with tidemq.SimpleConsumer("settlement", {"payments": "*"}, **tidemq_consumer(v2)) as c:
        got = _receive_n(c, 3, invisible_s=30, timeout_s=5)
    assert sorted(m.body for m in got) == [b"tx-commit", b"tx-open"]


def change_invisible_then_redelivered(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("jobs", "workers")
    consumer = consuming(
        v2, programs, "workers", "jobs", await_s=2,
        rounds=[
            # Invisible for 30 s, shortened to 10 s and not acked: back after 10 s, not 30.
            {"count": 1, "invisible_s": 30, "change_invisible_s": 10, "timeout_s": 30},
            {"count": 1, "invisible_s": 30, "ack": True, "timeout_s": 30},
        ],
    )  # fmt: skip
    ids = produce(v2, programs, "jobs", [{"body": "job-1", "tag": "run"}])
    events = ended(consumer)
    first, again = of(events, "received")
    assert first["message_id"] == again["message_id"] == ids["job-1"]
    assert (first["delivery_attempt"], again["delivery_attempt"]) == (1, 2)
    assert [c["message_id"] for c in of(events, "changed")] == [ids["job-1"]]
    gap_ms = again["received_at_ms"] - first["received_at_ms"]
    assert 10_000 - 50 <= gap_ms < 30_000, gap_ms
    # The ack with the handle of the second delivery works.
    assert [(a["round"], a["message_id"]) for a in of(events, "acked")] == [(1, ids["job-1"])]
    assert not of(events, "error")
    wait_until(lambda: v2.settled("workers", "jobs"), 10, "the group done with the topic")


def push_retries_then_succeeds(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("emails", "mailer", retry_delays_s=[1], max_delivery_attempts=5)
    push = programs.start("push_consumer", v2.plan(group="mailer", topic="emails", fail_times=2))
    push.wait_for("the group's queues", lambda _: v2.joined("mailer", "emails"), 30)
    ids = produce(v2, programs, "emails", [{"body": "welcome"}])
    push.wait_for("a successful delivery", lambda p: any(d["ok"] for d in p.of("delivery")), 40)
    wait_until(lambda: v2.settled("mailer", "emails"), 20, "the ack of the third delivery")
    deliveries = of(push.finish(), "delivery")
    assert [(d["message_id"], d["delivery_attempt"], d["ok"]) for d in deliveries] == [
        (ids["welcome"], 1, False), (ids["welcome"], 2, False), (ids["welcome"], 3, True),
    ]  # fmt: skip


def push_dead_letters_after_max_attempts(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("imports", "importer", retry_delays_s=[1], max_delivery_attempts=2)
    push = programs.start(
        "push_consumer", v2.plan(group="importer", topic="imports", fail_times=99)
    )
    push.wait_for("the group's queues", lambda _: v2.joined("importer", "imports"), 30)
    ids = produce(v2, programs, "imports", [{"body": "poison"}])
    wait_until(lambda: bool(v2.admin.dead_letters("importer")), 40, "the dead letter")
    dead = v2.admin.dead_letters("importer")
    assert [m.body for m in dead] == [b"poison"]
    wait_until(lambda: v2.settled("importer", "imports"), 10, "the group done with the topic")
    deliveries = of(push.finish(), "delivery")
    assert [(d["message_id"], d["delivery_attempt"]) for d in deliveries] == [
        (ids["poison"], 1), (ids["poison"], 2),
    ]  # fmt: skip


def official_producer_to_tidemq_consumer(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("audit-in", "archiver")
    ids = produce(v2, programs, "audit-in", [
        {"body": "event-1", "tag": "login", "keys": ["user-7"], "properties": {"ip": "10.0.0.7"}},
    ])  # fmt: skip
    with tidemq.SimpleConsumer("archiver", {"audit-in": "login"}, **tidemq_consumer(v2)) as c:
        [m] = _receive_n(c, 1, invisible_s=30)
        c.ack(m)
    assert ids["event-1"]
    assert (m.body, m.tag, m.keys) == (b"event-1", "login", ("user-7",))
    assert m.properties["ip"] == "10.0.0.7"


def tidemq_producer_to_official_consumer(v2: V2Cluster, programs: Programs) -> None:
    v2.topic("audit-out", "reporter")
    consumer = consuming(
        v2, programs, "reporter", "audit-out", tag="login", await_s=2,
        rounds=[{"count": 1, "invisible_s": 30, "ack": True, "timeout_s": 30}],
    )  # fmt: skip
    with tidemq.Producer(v2.nameserver.address) as producer:
        r = producer.send(
            "audit-out", b"event-2", tag="login", keys=["user-8"], properties={"ip": "10.0.0.8"}
        )
    assert r.ok
    events = ended(consumer)
    [m] = of(events, "received")
    assert m["message_id"] == r.msg_id
    assert (m["body"], m["tag"], m["keys"], m["properties"]) == (
        "event-2", "login", ["user-8"], {"ip": "10.0.0.8"},
    )  # fmt: skip
    assert (m["delivery_attempt"], m["corrupted"]) == (1, False)
    assert [a["message_id"] for a in of(events, "acked")] == [r.msg_id]


def docs_example(v2: V2Cluster, programs: Programs, example: str) -> None:
    """The example of docs/rocketmq-clients.md runs as printed, against the topic it names."""
    v2.admin.create_topic("example-orders", queues=QUEUES)
    lines = programs.run_script(EXAMPLES / example, v2.endpoints)
    sent = [line.split()[1] for line in lines if line.startswith("sent ")]
    received = [line for line in lines if line.startswith("received ")]
    assert len(sent) == len(received) == 1, lines
    assert received[0].split()[1:3] == [sent[0], "created"], received
    assert "order-1" in received[0]
    assert "source" in received[0]
    assert "hello from the official" in received[0]
