"""Receive/ack consumption through the SDK as applications use it: SimpleConsumer and
PushConsumer (and their asyncio versions) against real nameserver and broker processes over
real gRPC, and the dead-letter queue listed and resent through Admin."""

from __future__ import annotations

import dataclasses
import time

import pytest

import tidemq
from tests.integration.conftest import StartNameServer
from tests.integration.failover import Group, group_fixture  # noqa: F401 - the group fixture
from tests.integration.receive_sdk_helpers import (  # noqa: F401 - the cluster fixture
    FAST,
    _acked,
    _receive_n,
    _send,
    _topic,
    cluster_fixture,
)
from tests.integration.test_sdk import Cluster, broker_flags
from tests.waiting import wait_until
from tidemq.errors import (
    ConsumeDisabled,
    ConsumeModelMismatch,
    InvalidArgumentError,
    MessageAlreadyAcked,
    NotFoundError,
    ReceiptHandleExpired,
)

pytestmark = pytest.mark.integration


def test_simple_consumer_acks_and_an_unacked_message_comes_back_with_its_attempt(
    cluster: Cluster,
) -> None:
    _topic(cluster, "orders", "billing", delays_s=[0.2])
    sent = _send(cluster, "orders", ["a", "b", "c"], tag="created", keys=["k1"])
    with tidemq.SimpleConsumer(
        "billing", {"orders": "created"}, nameserver=cluster.address, config=FAST
    ) as c:
        got = _receive_n(c, 3, invisible_s=2.0)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in sent)
        assert {m.delivery_attempt for m in got} == {1}
        assert len({m.receipt_handle for m in got}) == 3 and all(m.receipt_handle for m in got)
        assert all(m.invisible_until_ms > time.time() * 1000 for m in got)
        assert all((m.tag, m.keys, m.broker) == ("created", ("k1",), "broker-a") for m in got)
        kept = next(m for m in got if m.body == b"b")
        for m in got:
            if m is not kept:
                c.ack(m)
        with pytest.raises(MessageAlreadyAcked):
            c.ack(next(m for m in got if m.body == b"a"))
        # Invisible to everyone (this member too) until its 2 s end; then delivered again.
        again = _receive_n(c, 1, invisible_s=10.0, timeout_s=15)
        assert [(m.msg_id, m.delivery_attempt) for m in again] == [(kept.msg_id, 2)]
        with pytest.raises(ReceiptHandleExpired):
            c.ack(kept)  # the first delivery's handle: that delivery is over
        c.ack(again[0])
        assert c.receive(16, 5.0, timeout_s=2.5) == []  # nothing else, ever


def test_nack_redelivers_after_the_group_backoff(cluster: Cluster) -> None:
    _topic(cluster, "nacks", "g-nack", delays_s=[1.0, 1.0])
    _send(cluster, "nacks", ["x"])
    with tidemq.SimpleConsumer("g-nack", "nacks", nameserver=cluster.address, config=FAST) as c:
        [m] = _receive_n(c, 1, invisible_s=30.0)
        nacked_at = time.monotonic()
        c.nack(m)
        [again] = _receive_n(c, 1, invisible_s=30.0, timeout_s=15)
        waited = time.monotonic() - nacked_at
        assert (again.msg_id, again.delivery_attempt) == (m.msg_id, 2)
        assert 0.8 <= waited < 5, waited  # the group's 1 s delay, not the 30 s invisibility
        c.ack(again)


def test_change_invisible_duration_replaces_the_handle_in_place_both_ways(
    cluster: Cluster,
) -> None:
    _topic(cluster, "changes", "g-change", delays_s=[0.2])
    _send(cluster, "changes", ["short", "long"])
    with tidemq.SimpleConsumer("g-change", "changes", nameserver=cluster.address, config=FAST) as c:
        got = {m.body: m for m in _receive_n(c, 2, invisible_s=30.0)}
        short, long = got[b"short"], got[b"long"]
        before = dataclasses.replace(short)
        c.change_invisible_duration(short, 1.0)  # shorten: 30 s -> 1 s from now
        assert short.receipt_handle != before.receipt_handle
        assert short.invisible_until_ms < before.invisible_until_ms
        with pytest.raises(ReceiptHandleExpired):
            c.ack(before)  # the old handle stopped working
        [back] = _receive_n(c, 1, invisible_s=30.0, timeout_s=10)
        assert (back.body, back.delivery_attempt) == (b"short", 2)
        c.ack(back)

        c.change_invisible_duration(long, 1.0)
        c.change_invisible_duration(long, 30.0)  # extend again: past the 1 s
        assert c.receive(16, 30.0, timeout_s=3.0) == []  # not redelivered
        c.ack(long)  # the newest handle works
        with pytest.raises(InvalidArgumentError):
            c.change_invisible_duration(long, 0)


def test_dead_letter_and_admin_lists_and_resends_it(cluster: Cluster) -> None:
    _topic(cluster, "poison", "g-dlq", delays_s=[0.2])
    [sent] = _send(
        cluster, "poison", ["bad"], tag="t1", keys=["order-9"], properties={"src": "web"}
    )
    with tidemq.SimpleConsumer("g-dlq", "poison", nameserver=cluster.address, config=FAST) as c:
        [m] = _receive_n(c, 1, invisible_s=30.0)
        c.dead_letter(m, reason="cannot parse")
        with tidemq.Admin(cluster.address) as admin:
            dead: list[tidemq.ReceivedMessage] = []

            def listed() -> bool:
                dead[:] = admin.dead_letters("g-dlq")
                return bool(dead)

            wait_until(listed, 20, "the dead letter listed")
            [d] = dead
            assert (d.topic, d.body, d.tag, d.keys) == ("%DLQ%g-dlq", b"bad", "t1", ("order-9",))
            assert d.properties["src"] == "web"
            assert d.properties["RETRY_TOPIC"] == "poison"
            assert d.properties["ORIGIN_MESSAGE_ID"] == sent.msg_id
            assert "cannot parse" in d.properties["DLQ_REASON"]
            resent = admin.resend_dead_letter("g-dlq", d.msg_id)
        assert resent.ok and resent.topic == "poison"
        [back] = _receive_n(c, 1, invisible_s=30.0)
        assert (back.body, back.tag, back.keys, back.delivery_attempt) == (
            b"bad",
            "t1",
            ("order-9",),
            1,
        )
        assert back.properties["src"] == "web"
        assert not any(k.startswith("DLQ_") for k in back.properties)
        c.ack(back)


def test_receives_reach_every_broker_group_of_the_topic(cluster: Cluster) -> None:
    b = cluster.start_broker(*broker_flags(cluster.nameserver, "broker-b"), store="broker-b")
    cluster.brokers["broker-b"] = b
    with tidemq.Admin(cluster.address) as admin:
        assert admin.create_topic("spread", queues=2) == ["broker-a", "broker-b"]
    results = _send(cluster, "spread", [f"m{i}" for i in range(12)])
    assert {r.broker for r in results} == {"broker-a", "broker-b"}
    with tidemq.SimpleConsumer("g-spread", "spread", nameserver=cluster.address, config=FAST) as c:
        got = _receive_n(c, 12, invisible_s=30.0)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)
        assert {m.broker for m in got} == {"broker-a", "broker-b"}
        # One call per broker group; each goes to the master of the message's group.
        assert c.ack_many(got) == [None] * 12


def test_admin_reads_changes_lists_and_deletes_a_consumer_group(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("settings", queues=1)
        updated = admin.update_consumer_group(
            "g-settings",
            max_delivery_attempts=3,
            retry_policy=tidemq.admin.RetryPolicy.exponential(500, 8_000, 2.0),
            fifo=True,
        )
        assert (updated.max_delivery_attempts, updated.fifo, updated.consume_enabled) == (
            3,
            True,
            True,
        )
        with tidemq.SimpleConsumer(
            "g-settings", "settings", nameserver=cluster.address, config=FAST
        ):
            g = admin.get_consumer_group("g-settings")
        assert (g.model, g.brokers) == ("receive", ("broker-a",))
        assert g.retry_policy == tidemq.admin.RetryPolicy.exponential(500, 8_000, 2.0)
        assert "g-settings" in {x.group for x in admin.list_consumer_groups()}
        paused = admin.update_consumer_group("g-settings", consume_enabled=False)
        assert not paused.consume_enabled and paused.fifo  # only the named setting changed
        with (
            tidemq.SimpleConsumer(
                "g-settings", "settings", nameserver=cluster.address, config=FAST
            ) as c,
            pytest.raises(ConsumeDisabled),
        ):
            c.receive(1, 30.0, timeout_s=0)
        assert admin.delete_consumer_group("g-settings") == ["broker-a"]
        with pytest.raises(NotFoundError):
            admin.get_consumer_group("g-settings")


def test_a_group_that_consumes_by_offsets_refuses_a_simple_consumer(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("mixed", queues=1)
    with tidemq.Consumer(cluster.address, group="g-offsets", topic="mixed"):
        pass
    with pytest.raises(ConsumeModelMismatch) as e:
        tidemq.SimpleConsumer("g-offsets", "mixed", nameserver=cluster.address)
    assert not e.value.retriable


def test_an_ack_after_the_master_is_killed_goes_to_the_new_master(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, "orders", 2)
    first = group.master()
    with tidemq.Admin(ns.address) as admin:
        admin.update_consumer_group("g-failover", retry_delays_s=[0.2])
    _send_to(ns.address, "orders", ["a", "b"])
    config = tidemq.SimpleConsumerConfig(start_from="first", request_timeout_ms=30_000)
    with tidemq.SimpleConsumer("g-failover", "orders", nameserver=ns.address, config=config) as c:
        got: list[tidemq.ReceivedMessage] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += c.receive(2 - len(got), 60.0, timeout_s=1.0)
        assert sorted(m.body for m in got) == [b"a", b"b"]
        c.ack(got[0])
        group.kill(first)
        # The handle names the broker group, not the dead broker: the ack waits for the
        # election and lands on the new master, which knows the lease from the replicated log.
        c.ack(got[1])
        second = group.master(not_id=first)
        assert second != first
        with tidemq.Admin(ns.address) as admin:
            queues = admin.receive_state("g-failover", "orders").queues
        assert sum(q.inflight + q.retrying for q in queues) == 0
        assert all(q.done_offset == q.max_offset for q in queues)


def _send_to(nameserver: str, topic: str, bodies: list[str]) -> None:
    with tidemq.Producer(nameserver) as producer:
        assert all(producer.send(topic, b).ok for b in bodies)
