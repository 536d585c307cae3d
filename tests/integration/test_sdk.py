"""The Python SDK as applications use it: real nameserver and broker processes, real gRPC."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import tidemq
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.waiting import wait_until
from tidemq.errors import InvalidArgumentError, RouteNotFoundError

pytestmark = pytest.mark.integration

# Consumers re-read membership this often in tests (the default is 5 s).
FAST = {"rebalance_interval_ms": 300, "heartbeat_interval_ms": 300, "long_poll_ms": 2_000}


@dataclass
class Cluster:
    nameserver: NameServerProcess
    brokers: dict[str, BrokerProcess]
    start_broker: Callable[..., BrokerProcess]

    @property
    def address(self) -> str:
        return self.nameserver.address


def broker_flags(ns: NameServerProcess, name: str, *extra: str) -> list[str]:
    return ["--nameserver", ns.address, "--broker-name", name, "--auto-create-topics", *extra]


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    ns = start_nameserver()
    b = start_broker(*broker_flags(ns, "broker-a"), store="broker-a")
    c = Cluster(ns, {"broker-a": b}, start_broker)
    _routable(c.address)
    return c


def _routable(nameserver: str) -> None:
    with tidemq.Admin(nameserver) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master broker routed")


def consume_all(consumer: tidemq.Consumer, expected: int, timeout_s: float = 30) -> list:  # type: ignore[type-arg]
    got: list[tidemq.ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        got += consumer.poll(max_messages=256, timeout_s=1.0)
    return got


def test_send_and_consume_keep_every_field(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        assert admin.create_topic("orders", queues=4) == ["broker-a"]
    with tidemq.Producer(cluster.address) as producer:
        r = producer.send(
            "orders", b'{"id": 1}', tag="created", keys=["order-1", "cust-9"], properties={"a": "1"}
        )
        assert r.status is tidemq.SendStatus.SEND_OK
        assert (r.broker, r.topic, r.queue_offset) == ("broker-a", "orders", 0)
        assert 0 <= r.queue_id < 4 and len(r.msg_id) == 32
    with tidemq.Consumer(cluster.address, group="billing", topic="orders", start_from="first") as c:
        [m] = consume_all(c, 1)
    assert (m.body, m.tag, m.keys, m.properties) == (
        b'{"id": 1}',
        "created",
        ("order-1", "cust-9"),
        {"a": "1"},
    )
    assert (m.msg_id, m.queue_id, m.queue_offset, m.broker) == (r.msg_id, r.queue_id, 0, "broker-a")
    assert m.store_timestamp_ms >= m.born_timestamp_ms > 0


def test_first_send_to_unknown_topic_creates_it_on_an_auto_create_broker(
    cluster: Cluster,
) -> None:
    with tidemq.Producer(cluster.address) as producer, tidemq.Admin(cluster.address) as admin:
        first = producer.send("fresh-topic", "m0")
        # The creating send answers only once the nameserver has the route, so a consumer
        # started right after it finds the topic (no wait, no retry).
        route = admin.route("fresh-topic")
        results = [first, *(producer.send("fresh-topic", f"m{i}") for i in range(1, 20))]
        assert "fresh-topic" in admin.list_topics()
    assert {r.status for r in results} == {tidemq.SendStatus.SEND_OK}
    assert set(route.groups) == {"broker-a"}


def test_unknown_topic_without_auto_create_fails_fast_and_typed(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    ns = start_nameserver()
    start_broker("--nameserver", ns.address)
    _routable(ns.address)
    with tidemq.Producer(ns.address) as producer:
        started = time.monotonic()
        with pytest.raises(RouteNotFoundError) as e:
            producer.send("nowhere", b"x")
    assert not e.value.retriable and e.value.code == "ROUTE_NOT_FOUND"
    assert time.monotonic() - started < 5  # not retried until the send timeout


def test_send_async_batches_many_small_sends_into_few_requests(cluster: Cluster) -> None:
    n = 5_000
    with tidemq.Producer(cluster.address) as producer:
        futures = [producer.send_async("batched", b"x" * 100) for _ in range(n)]
        results = [f.result(timeout=60) for f in futures]
        stats = producer.stats
    assert all(r.ok for r in results)
    assert stats.requests < n / 10, stats
    # Every message has its own place: per queue, offsets 0..k-1 exactly once.
    by_queue: dict[int, list[int]] = defaultdict(list)
    for r in results:
        by_queue[r.queue_id].append(r.queue_offset)
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))
    # Round robin by block: each request (one block) went to the next queue.
    assert len(by_queue) == min(8, stats.requests)


def test_sharding_key_keeps_a_keys_messages_in_one_queue_in_order(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        futures = [
            (key, i, producer.send_async("ordered", f"{key}:{i}", sharding_key=key))
            for i in range(50)
            for key in ("alice", "bob", "carol")
        ]
        results = [(key, i, f.result(timeout=30)) for key, i, f in futures]
    queues = defaultdict(set)
    for key, _, r in results:
        queues[key].add(r.queue_id)
    assert all(len(q) == 1 for q in queues.values()), queues
    with tidemq.Consumer(cluster.address, group="g", topic="ordered", start_from="first") as c:
        got = consume_all(c, 150)
    for key in ("alice", "bob", "carol"):
        seen = [int(m.body.decode().split(":")[1]) for m in got if m.body.startswith(key.encode())]
        assert seen == list(range(50)), key


def test_bad_messages_raise_typed_errors_that_are_not_retried(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        with pytest.raises(InvalidArgumentError) as e:
            producer.send("orders", b"x" * (5 << 20))  # the broker's limit is 4 MiB
        assert (e.value.code, e.value.retriable) == ("BODY_TOO_LARGE", False)
        with pytest.raises(InvalidArgumentError) as e2:
            producer.send("bad topic!", b"x")
        assert e2.value.code == "INVALID_TOPIC"
        with pytest.raises(InvalidArgumentError):
            producer.send("orders", 42)  # type: ignore[arg-type]
        assert producer.stats.failed_requests <= 1  # the oversize body, never retried
        assert producer.send("orders", b"fine").ok  # and the producer still works


def test_asyncio_api(cluster: Cluster) -> None:
    async def main() -> list[tidemq.ReceivedMessage]:
        async with tidemq.AsyncProducer(cluster.address) as producer:
            results = await asyncio.gather(*(producer.send("aio", f"m{i}") for i in range(100)))
            assert all(r.ok for r in results)
            batch = await producer.send_batch(
                [tidemq.Message("aio", f"b{i}".encode(), tag="batch") for i in range(10)]
            )
            # One request, one queue, consecutive offsets: appended atomically.
            assert len({r.queue_id for r in batch}) == 1
            offsets = [r.queue_offset for r in batch]
            assert offsets == list(range(offsets[0], offsets[0] + 10))
        got: list[tidemq.ReceivedMessage] = []
        async with tidemq.AsyncConsumer(
            cluster.address, group="aio-g", topic="aio", start_from="first", **FAST
        ) as consumer:
            deadline = time.monotonic() + 30
            while len(got) < 110 and time.monotonic() < deadline:
                got += await consumer.poll(64, timeout_s=1.0)
        return got

    got = asyncio.run(main())
    assert sorted(m.body for m in got) == sorted(
        [f"m{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(10)]
    )


def test_producer_moves_to_another_group_when_a_broker_dies(cluster: Cluster) -> None:
    b = cluster.start_broker(*broker_flags(cluster.nameserver, "broker-b"), store="broker-b")
    cluster.brokers["broker-b"] = b
    with tidemq.Admin(cluster.address) as admin:
        assert admin.create_topic("ha", queues=2) == ["broker-a", "broker-b"]
    # Not idempotent: an idempotent message keeps its queue (and waits for its group to come
    # back) so that no retry can store it twice (test_idempotent_producer.py).
    with tidemq.Producer(cluster.address, send_timeout_ms=10_000, idempotent=False) as producer:
        before = [producer.send("ha", f"before-{i}") for i in range(8)]
        assert {r.broker for r in before} == {"broker-a", "broker-b"}
        cluster.brokers["broker-a"].kill()
        # The nameserver still routes broker-a (it expires after 120 s); sends must not fail.
        after = [producer.send("ha", f"after-{i}") for i in range(20)]
    assert all(r.ok for r in after)
    assert {r.broker for r in after} == {"broker-b"}


def test_clustering_spreads_queues_and_rebalances_on_join_and_leave(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("work", queues=8)
    all_queues = {tidemq.MessageQueue("work", "broker-a", q) for q in range(8)}
    a = tidemq.Consumer(cluster.address, group="workers", topic="work", **FAST)
    try:
        assert a.assignment() == all_queues
        b = tidemq.Consumer(cluster.address, group="workers", topic="work", **FAST)
        try:

            def split() -> bool:
                qa, qb = a.assignment(), b.assignment()
                return not (qa & qb) and qa | qb == all_queues and len(qa) == len(qb) == 4

            wait_until(split, 20, "queues split between two members")
        finally:
            b.close()
        wait_until(lambda: a.assignment() == all_queues, 20, "a owns all again")
    finally:
        a.close()


def test_committed_offsets_survive_a_broker_restart(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i in range(40):
            producer.send("durable", f"m{i}")
    with tidemq.Consumer(
        cluster.address, group="g", topic="durable", start_from="first", auto_commit=False
    ) as c:
        first = consume_all(c, 40)
        assert len(first) == 40
        c.commit()
    old = cluster.brokers["broker-a"]
    assert old.terminate() == 0
    port = int(old.address.rsplit(":", 1)[1])
    restarted = cluster.start_broker(
        *broker_flags(cluster.nameserver, "broker-a"), store="broker-a", port=port
    )
    cluster.brokers["broker-a"] = restarted
    with tidemq.Producer(cluster.address) as producer:
        for i in range(40, 50):
            producer.send("durable", f"m{i}")
    with tidemq.Consumer(cluster.address, group="g", topic="durable", start_from="first") as c:
        rest = consume_all(c, 10)
        extra = c.poll(max_messages=100, timeout_s=1.0)
    assert sorted(m.body for m in rest) == sorted(f"m{i}".encode() for i in range(40, 50))
    assert extra == []


def test_uncommitted_messages_are_delivered_again(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i in range(10):
            producer.send("again", f"m{i}")
    settings = {"start_from": "first", "auto_commit": False}
    with tidemq.Consumer(cluster.address, group="g", topic="again", **settings) as c:
        assert len(consume_all(c, 10)) == 10  # read, never committed: a crash before commit
    with tidemq.Consumer(cluster.address, group="g", topic="again", **settings) as c:
        assert sorted(m.body for m in consume_all(c, 10)) == sorted(
            f"m{i}".encode() for i in range(10)
        )


def test_auto_commit_commits_what_was_polled_at_close(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i in range(10):
            producer.send("auto", f"m{i}")
    with tidemq.Consumer(cluster.address, group="g", topic="auto", start_from="first") as c:
        assert len(consume_all(c, 10)) == 10
    with tidemq.Admin(cluster.address) as admin:
        status = admin.queue_status("auto", "g")
    assert sum(q.committed_offset or 0 for q in status) == 10
    assert all(q.lag in (0, None) for q in status)


def test_broadcasting_gives_every_member_every_message(cluster: Cluster, tmp_path: Path) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i in range(30):
            producer.send("news", f"m{i}")
    common = {"mode": "broadcasting", "start_from": "first", "local_offsets_dir": str(tmp_path)}
    with (
        tidemq.Consumer(cluster.address, group="n", topic="news", instance_name="a", **common) as a,
        tidemq.Consumer(cluster.address, group="n", topic="news", instance_name="b", **common) as b,
    ):
        got_a, got_b = consume_all(a, 30), consume_all(b, 30)
    assert len(got_a) == len(got_b) == 30
    # Local offsets: instance "a" restarted reads nothing old.
    with tidemq.Consumer(
        cluster.address, group="n", topic="news", instance_name="a", **common
    ) as a:
        assert a.poll(100, timeout_s=1.0) == []


def test_new_group_starting_from_last_sees_only_new_messages(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i in range(10):
            producer.send("late", f"old{i}")
        with tidemq.Consumer(cluster.address, group="late-g", topic="late", **FAST) as c:
            producer.send("late", "new")
            got = consume_all(c, 1)
    assert [m.body for m in got] == [b"new"]


def test_tag_filter(cluster: Cluster) -> None:
    with tidemq.Producer(cluster.address) as producer:
        for i, tag in enumerate(["a", "b", "c"] * 10):
            producer.send("tagged", f"{tag}{i}", tag=tag)
    with tidemq.Consumer(
        cluster.address, group="t", topic="tagged", tags="a || c", start_from="first"
    ) as c:
        got = consume_all(c, 20)
        assert c.poll(100, timeout_s=0.5) == []
    assert {m.tag for m in got} == {"a", "c"} and len(got) == 20


def test_poll_returns_as_soon_as_a_message_arrives(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("wake", queues=1)
    # The consumer's pull task is already in a 30 s long poll when the message is sent.
    with tidemq.Consumer(cluster.address, group="w", topic="wake", long_poll_ms=30_000) as c:
        result: list[list[tidemq.ReceivedMessage]] = []
        polling = threading.Thread(target=lambda: result.append(c.poll(1, timeout_s=25)))
        polling.start()
        sent = time.monotonic()
        with tidemq.Producer(cluster.address) as producer:
            producer.send("wake", b"now")
        polling.join(timeout=30)
        took = time.monotonic() - sent
    assert [m.body for m in result[0]] == [b"now"]
    assert took < 10  # woken by the arrival, not by the 25 s poll or 30 s long-poll deadline
