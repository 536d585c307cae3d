"""The push consumers (blocking and asyncio) against a real broker: listener outcomes, retries
and the DLQ, concurrency and buffering, renewal, and close."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import pytest

import tidemq
from tests.integration.receive_sdk_helpers import (  # noqa: F401 - the cluster fixture
    FAST,
    _acked,
    _receive_n,
    _send,
    _topic,
    cluster_fixture,
)
from tests.integration.test_sdk import Cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


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
