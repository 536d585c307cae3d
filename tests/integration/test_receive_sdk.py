"""Receive/ack consumption through the SDK as applications use it: SimpleConsumer and
PushConsumer (and their asyncio versions) against real nameserver and broker processes over
real gRPC, and the dead-letter queue listed and resent through Admin."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.failover import Group
from tests.integration.test_sdk import Cluster, _routable, broker_flags
from tests.integration.zookeeper import ZooKeeperServer
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

FAST = tidemq.SimpleConsumerConfig(start_from="first", heartbeat_interval_ms=500)


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    ns = start_nameserver()
    b = start_broker(*broker_flags(ns, "broker-a"), store="broker-a")
    c = Cluster(ns, {"broker-a": b}, start_broker)
    _routable(c.address)
    return c


def _topic(
    cluster: Cluster, topic: str, group: str, *, delays_s: list[float], attempts: int = 16
) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic(topic, queues=2)
        admin.update_consumer_group(group, retry_delays_s=delays_s, max_delivery_attempts=attempts)


def _send(
    cluster: Cluster, topic: str, bodies: list[str], **kwargs: object
) -> list[tidemq.SendResult]:
    with tidemq.Producer(cluster.address) as producer:
        results = [producer.send(topic, b, **kwargs) for b in bodies]  # type: ignore[arg-type]
    assert all(r.ok for r in results)
    return results


def _receive_n(
    consumer: tidemq.SimpleConsumer, n: int, invisible_s: float, timeout_s: float = 20
) -> list[tidemq.ReceivedMessage]:
    got: list[tidemq.ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive(n - len(got), invisible_s, timeout_s=1.0)
    return got


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


def test_push_consumer_success_failure_and_exception_with_retries_and_attempts(
    cluster: Cluster,
) -> None:
    _topic(cluster, "pushed", "g-push", delays_s=[0.2])
    _send(cluster, "pushed", ["ok", "fail-once", "raise-once"])
    attempts: dict[bytes, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        with lock:
            attempts[m.body].append(m.delivery_attempt)
        if m.delivery_attempt == 1 and m.body == b"fail-once":
            return tidemq.ConsumeResult.FAILURE
        if m.delivery_attempt == 1 and m.body == b"raise-once":
            raise RuntimeError("boom")
        return tidemq.ConsumeResult.SUCCESS

    config = tidemq.PushConsumerConfig(start_from="first", invisible_duration_s=30.0)
    with tidemq.PushConsumer(
        "g-push", "pushed", listener, nameserver=cluster.address, config=config
    ) as consumer:
        wait_until(lambda: consumer.stats.acked == 3, 30, "three messages acked")
        stats = consumer.stats
    # Retried after the 0.2 s delay, not after the 30 s invisibility: FAILURE and an
    # exception both nack.
    assert dict(attempts) == {b"ok": [1], b"fail-once": [1, 2], b"raise-once": [1, 2]}
    assert (stats.succeeded, stats.failed, stats.nacked, stats.ack_errors) == (3, 2, 2, 0)


def test_push_consumer_failures_end_in_the_dlq_after_max_delivery_attempts(
    cluster: Cluster,
) -> None:
    _topic(cluster, "doomed", "g-doomed", delays_s=[0.2], attempts=2)
    [sent] = _send(cluster, "doomed", ["never works"])
    attempts: list[int] = []

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        attempts.append(m.delivery_attempt)
        return tidemq.ConsumeResult.FAILURE

    config = tidemq.PushConsumerConfig(start_from="first")
    with (
        tidemq.PushConsumer(
            "g-doomed", "doomed", listener, nameserver=cluster.address, config=config
        ),
        tidemq.Admin(cluster.address) as admin,
    ):
        dead: list[tidemq.ReceivedMessage] = []

        def listed() -> bool:
            dead[:] = admin.dead_letters("g-doomed")
            return bool(dead)

        wait_until(listed, 30, "the message dead-lettered")
    assert attempts == [1, 2]
    [d] = dead
    assert d.properties["ORIGIN_MESSAGE_ID"] == sent.msg_id
    assert d.properties["DLQ_DELIVERY_ATTEMPTS"] == "2"


def test_push_consumer_runs_at_most_max_concurrency_listeners_and_buffers_at_most_buffer_messages(
    cluster: Cluster,
) -> None:
    _topic(cluster, "busy", "g-busy", delays_s=[0.2])
    _send(cluster, "busy", [f"m{i}" for i in range(12)])
    release = threading.Event()
    lock = threading.Lock()
    running = 0
    most = 0
    done: list[bytes] = []

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(30)
        with lock:
            running -= 1
            done.append(m.body)
        return tidemq.ConsumeResult.SUCCESS

    config = tidemq.PushConsumerConfig(
        start_from="first", max_concurrency=3, buffer_messages=2, invisible_duration_s=30.0
    )
    with tidemq.PushConsumer(
        "g-busy", "busy", listener, nameserver=cluster.address, config=config
    ) as consumer:
        wait_until(lambda: running == 3, 20, "three listeners running")
        wait_until(lambda: consumer.buffered == 2, 20, "two messages buffered")
        with tidemq.Admin(cluster.address) as admin:
            # Three running and two received ahead are in flight; the rest never looked at.
            state = admin.receive_state("g-busy", "busy")
            assert sum(q.inflight for q in state.queues) == 5
        release.set()
        wait_until(lambda: consumer.stats.acked == 12, 30, "all twelve acked")
    assert most == 3
    assert sorted(done) == sorted(f"m{i}".encode() for i in range(12))


def test_push_consumer_renews_a_long_listener_and_close_flushes_its_ack(
    cluster: Cluster,
) -> None:
    _topic(cluster, "slow", "g-slow", delays_s=[0.2])
    _send(cluster, "slow", ["long job"])
    deliveries: list[int] = []
    started = threading.Event()
    finish = threading.Event()

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        deliveries.append(m.delivery_attempt)
        started.set()
        finish.wait(30)
        return tidemq.ConsumeResult.SUCCESS

    config = tidemq.PushConsumerConfig(
        start_from="first", invisible_duration_s=1.5, ack_linger_ms=60_000
    )
    consumer = tidemq.PushConsumer(
        "g-slow", "slow", listener, nameserver=cluster.address, config=config
    )
    try:
        assert started.wait(20)
        # Three times its invisible duration: alive only because it is renewed.
        wait_until(lambda: consumer.stats.renewed >= 3, 20, "three renewals")
        finish.set()
    finally:
        consumer.close()  # the ack lingers 60 s: only close sends it
    assert deliveries == [1]
    assert (consumer.stats.acked, consumer.stats.ack_errors) == (1, 0)
    with tidemq.Admin(cluster.address) as admin:
        queues = admin.receive_state("g-slow", "slow").queues
    assert sum(q.inflight + q.retrying for q in queues) == 0
    assert all(q.done_offset == q.max_offset for q in queues)


def test_push_consumer_renews_a_buffered_message_so_it_is_delivered_once(
    cluster: Cluster,
) -> None:
    _topic(cluster, "queued", "g-queued", delays_s=[0.2])
    _send(cluster, "queued", ["first", "second"])
    deliveries: list[tuple[bytes, int]] = []
    started = threading.Event()
    finish = threading.Event()

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        deliveries.append((m.body, m.delivery_attempt))
        started.set()
        finish.wait(30)
        return tidemq.ConsumeResult.SUCCESS

    config = tidemq.PushConsumerConfig(
        start_from="first", max_concurrency=1, buffer_messages=1, invisible_duration_s=1.5
    )
    consumer = tidemq.PushConsumer(
        "g-queued", "queued", listener, nameserver=cluster.address, config=config
    )
    try:
        assert started.wait(20)
        wait_until(lambda: consumer.buffered == 1, 20, "one message buffered")
        # Both held for over three invisible durations: the waiting one too is renewed.
        wait_until(lambda: consumer.stats.renewed >= 6, 20, "three renewals each")
        assert (consumer.running, consumer.buffered) == (1, 1)
        finish.set()
        wait_until(lambda: consumer.stats.acked == 2, 20, "both acked")
    finally:
        consumer.close()
    assert sorted(deliveries) == [(b"first", 1), (b"second", 1)]
    assert consumer.stats.ack_errors == 0


def test_push_consumer_close_gives_up_on_a_stuck_listener_after_shutdown_timeout(
    cluster: Cluster,
) -> None:
    _topic(cluster, "stuck", "g-stuck", delays_s=[0.2])
    _send(cluster, "stuck", ["stuck", "waiting"])
    started = threading.Event()
    release = threading.Event()

    def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
        started.set()
        release.wait(30)
        return tidemq.ConsumeResult.SUCCESS

    config = tidemq.PushConsumerConfig(
        start_from="first", max_concurrency=1, buffer_messages=1, shutdown_timeout_ms=300
    )
    consumer = tidemq.PushConsumer(
        "g-stuck", "stuck", listener, nameserver=cluster.address, config=config
    )
    try:
        assert started.wait(20)
        wait_until(lambda: consumer.buffered == 1, 20, "one message buffered")
        began = time.monotonic()
        consumer.close()
        assert time.monotonic() - began < 5
    finally:
        release.set()  # the listener ends after close: its answer is dropped, nothing breaks
    assert (consumer.stats.succeeded, consumer.stats.acked) == (0, 0)
    with tidemq.Admin(cluster.address) as admin:
        state = admin.receive_state("g-stuck", "stuck")
    # Neither was acked: both come back to the group when their invisibility ends.
    assert sum(q.inflight for q in state.queues) == 2


def test_asyncio_simple_and_push_consumers(cluster: Cluster) -> None:
    _topic(cluster, "aio-r", "g-aio", delays_s=[0.2])
    _send(cluster, "aio-r", [f"m{i}" for i in range(6)], message_group="grp-1")

    async def main() -> tuple[list[tidemq.ReceivedMessage], list[bytes]]:
        got: list[tidemq.ReceivedMessage] = []
        async with tidemq.AsyncSimpleConsumer(
            "g-aio", "aio-r", nameserver=cluster.address, config=FAST
        ) as c:
            deadline = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < deadline:
                got += await c.receive(3 - len(got), 30.0, timeout_s=1.0)
            assert await c.ack_many(got) == [None] * len(got)
        pushed: list[bytes] = []
        three = asyncio.Event()

        async def listener(m: tidemq.ReceivedMessage) -> tidemq.ConsumeResult:
            pushed.append(m.body)
            if len(pushed) == 3:
                three.set()
            return tidemq.ConsumeResult.SUCCESS

        config = tidemq.PushConsumerConfig(start_from="first")
        async with tidemq.AsyncPushConsumer(
            "g-aio", "aio-r", listener, nameserver=cluster.address, config=config
        ) as consumer:
            await asyncio.wait_for(three.wait(), 20)
            await asyncio.wait_for(_acked(consumer, 3), 20)
        return got, pushed

    got, pushed = asyncio.run(main())
    assert {m.message_group for m in got} == {"grp-1"}
    assert sorted([m.body for m in got] + pushed) == [f"m{i}".encode() for i in range(6)]


async def _acked(consumer: tidemq.AsyncPushConsumer, n: int) -> None:
    while consumer.stats.acked < n:  # noqa: ASYNC110 - the stats have no event to wait on
        await asyncio.sleep(0.01)


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


@pytest.fixture
def group(start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(start_broker, zookeeper, zk_root)
    yield g
    g.thaw_all()


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
