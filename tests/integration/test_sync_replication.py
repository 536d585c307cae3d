"""SYNC_MASTER, the confirm offset, the lag report and config sync, over real broker processes."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest

import tidemq
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.integration.replicas import (
    ONE_MIB_FILES,
    QUEUES,
    assert_same_queues,
    create_topic,
    master_and_slave,
    pull_queue,
    send,
    send_batches,
    start,
    start_slave,
    status,
    topic_names,
    wait_identical,
    wait_in_sync,
)
from tests.waiting import wait_until
from tests.workers import Worker, finish_all
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration


def sync_master(start_broker: StartBroker, ns: NameServerProcess, *flags: str) -> BrokerProcess:
    return start(start_broker, ns, "master", "--role", "SYNC_MASTER", *flags)


def test_10000_messages_through_a_sync_master_are_on_the_slave_byte_for_byte(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    # Sync flush and sync replication together: SEND_OK means on the master's disk and on the
    # slave.
    master, slave = master_and_slave(
        start_broker, nameserver, "--role", "SYNC_MASTER", "--flush", "SYNC"
    )
    wait_in_sync(master)
    send_batches(master, "sync", 10_000)  # every batch answered SEND_OK
    wait_identical(master, slave)
    # A consumer reading only the slave gets every message at the master's queue offsets.
    assert_same_queues(master, slave, 10_000)


def test_every_send_ok_survives_a_sigkill_of_the_master(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver, "--role", "SYNC_MASTER")
    wait_in_sync(master)
    acked: list[tuple[int, int, bytes]] = []  # (queue, queue offset, body) of each SEND_OK
    stop = threading.Event()
    killed = threading.Event()

    def load(worker: int) -> None:
        n = 0
        while not stop.is_set():
            body = f"w{worker}-{n}".encode()
            try:
                r = send(master, body, queue_id=n % QUEUES)
            except (grpc.RpcError, ValueError):  # ValueError: kill() closed the channel mid-call
                if killed.is_set():
                    return  # the master died under us: the load ends
                raise  # before the kill, a failed send fails the test
            if r.status == broker_pb2.SEND_OK:
                acked.append((r.queue_id, r.queue_offset, body))
            n += 1

    workers = [Worker(functools.partial(load, w), name=f"load-{w}") for w in range(4)]
    for w in workers:
        w.start()
    try:
        wait_until(
            lambda: all(w.check() for w in workers) and len(acked) >= 1500,
            120,
            "1500 acknowledged sends",
        )
        killed.set()
        master.kill()
    finally:
        stop.set()
        finish_all(workers)
    on_slave = {(q, o, body) for q in range(QUEUES) for o, body in pull_queue(slave, q)}
    missing = [a for a in acked if a not in on_slave]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost: {missing[:5]}"


def test_stopped_slave_gives_timeouts_then_not_available_and_catching_up_restores_send_ok(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = sync_master(start_broker, nameserver, "--ha-sync-timeout-ms", "800")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
    wait_in_sync(master)
    assert send(master, b"before").status == broker_pb2.SEND_OK

    slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: acknowledgements stop
    try:
        started = time.monotonic()
        r = send(master, b"paused")
        assert r.status == broker_pb2.FLUSH_SLAVE_TIMEOUT
        assert 0.7 <= time.monotonic() - started < 5
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: send(master, b"resumed").status == broker_pb2.SEND_OK, 30, "SEND_OK again")

    assert slave.terminate() == 0  # gone: no slave in sync, answered at once
    wait_until(
        lambda: send(master, b"alone").status == broker_pb2.SLAVE_NOT_AVAILABLE,
        30,
        "SLAVE_NOT_AVAILABLE",
    )
    started = time.monotonic()
    assert send(master, b"alone-timed").status == broker_pb2.SLAVE_NOT_AVAILABLE
    assert time.monotonic() - started < 0.5

    # Whatever the status, every message was stored on the master.
    bodies = [b for _, b in pull_queue(master, 0)]
    assert bodies[:2] == [b"before", b"paused"] and b"alone-timed" in bodies

    slave = start_slave(start_broker, nameserver)
    wait_in_sync(master)
    assert send(master, b"after").status == broker_pb2.SEND_OK
    wait_identical(master, slave)
    assert [b for _, b in pull_queue(slave, 0)] == [*bodies, b"after"]


def test_confirm_offset_hides_what_no_slave_holds(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = start(start_broker, nameserver, "master", "--confirm-offset")
    create_topic(master)
    for i in range(10):
        assert send(master, f"m{i}".encode()).status == broker_pb2.SEND_OK  # ASYNC_MASTER

    def pull(wait_ms: int) -> broker_pb2.PullMessageResponse:
        return master.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group="g", topic="orders", queue_id=0, offset=0, long_poll_timeout_ms=wait_ms
            ),
            timeout=30,
        )

    held = pull(300)
    assert (held.status, len(held.messages)) == (broker_pb2.NO_NEW_MESSAGE, 0)
    start_slave(start_broker, nameserver)
    # A pull waiting at the confirm offset returns as soon as the slave acknowledges.
    got = pull(20_000)
    assert got.status == broker_pb2.FOUND
    assert [m.body for m in got.messages] == [f"m{i}".encode() for i in range(10)]
    assert status(master).replication.confirmed_offset == status(master).store.commitlog_max_offset


def test_lag_is_reported_in_the_log_metrics_and_cluster_status(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    metrics_port = free_port()
    master = start(
        start_broker,
        nameserver,
        "master",
        "--ha-lag-report-interval-ms",
        "300",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    )
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
    send_batches(master, "lag", 1_000)
    wait_identical(master, slave)
    # Reports come every 300 ms; the first may predate the catch-up (still behind, in sync).
    wait_until(
        lambda: (
            "replication lag report: slave group-a/1" in master.log()
            and "is 0 bytes and 0.000 s behind (in sync)" in master.log()
        ),
        30,
        "a lag report of the caught-up slave",
    )

    def scrape() -> str:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())

    text = scrape()
    assert (
        f'tidemq_replication_slave_lag_bytes{{slave_address="{slave.address}",slave_id="1"}} 0.0'
        in text
    )
    assert "tidemq_replication_slaves_in_sync 1.0" in text

    out = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "cluster", "status", "--json"],
        env={"TIDEMQ_NAMESERVER": nameserver.address, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    brokers = {b["broker_id"]: b for b in json.loads(out)["clusters"][0]["brokers"]}
    (lag,) = brokers[0]["replication"]["slaves"]
    assert (lag["broker_id"], lag["address"], lag["lag_bytes"], lag["in_sync"]) == (
        1,
        slave.address,
        0,
        True,
    )
    link = brokers[1]["replication"]["master"]
    assert (link["address"], link["connected"], link["lag_bytes"]) == (master.address, True, 0)


def test_config_sync_copies_topics_groups_offsets_and_keeps_newer_slave_offsets(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    create_topic(master, "payments")
    wait_until(lambda: "payments" in topic_names(slave), 30, "the new topic on the slave")

    m, s = master.stub(), slave.stub()
    m.Heartbeat(
        broker_pb2.HeartbeatRequest(
            client_id="c1",
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group="billing",
                    mode=broker_pb2.CLUSTERING,
                    subscriptions=[broker_pb2.Subscription(topic="orders")],
                )
            ],
        ),
        timeout=10,
    )
    for q in range(2):
        m.CommitOffset(
            broker_pb2.CommitOffsetRequest(group="billing", topic="orders", queue_id=q, offset=7),
            timeout=10,
        )

    def slave_offset(q: int) -> int | None:
        r = s.QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(group="billing", topic="orders", queue_id=q),
            timeout=10,
        )
        return int(r.offset) if r.found else None

    wait_until(lambda: slave_offset(1) == 7, 30, "the master's offsets on the slave")
    own = s.SyncConfig(broker_pb2.SyncConfigRequest(full=True), timeout=10)
    assert [(g.group, list(g.topics)) for g in own.groups] == [("billing", ["orders"])]

    # Committed on the slave (its master away, say): newer than the master's 7, it stays.
    s.CommitOffset(
        broker_pb2.CommitOffsetRequest(group="billing", topic="orders", queue_id=0, offset=42),
        timeout=10,
    )
    synced = status(slave).replication.last_config_sync_ms
    wait_until(
        lambda: status(slave).replication.last_config_sync_ms > synced + 600,
        30,
        "two more config syncs",
    )
    assert slave_offset(0) == 42
    assert slave_offset(1) == 7


def test_sdk_consumer_reads_from_the_slave_while_the_master_is_down_and_returns(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    with tidemq.Producer(nameserver.address) as producer:
        for i in range(200):
            assert producer.send("orders", f"m{i}").status is tidemq.SendStatus.SEND_OK
    wait_identical(master, slave)
    seen: set[bytes] = set()
    settings = {
        "start_from": "first",
        "master_retry_ms": 1_000,
        "long_poll_ms": 1_000,
        "rebalance_interval_ms": 300,
        "heartbeat_interval_ms": 300,
        "auto_commit_interval_ms": 300,
    }
    with tidemq.Consumer(nameserver.address, group="reader", topic="orders", **settings) as c:

        def consume_until(n: int) -> bool:
            seen.update(m.body for m in c.poll(max_messages=50, timeout_s=0.5))
            return len(seen) >= n

        wait_until(lambda: consume_until(100), 30, "the first 100 messages from the master")
        master.kill()
        wait_until(lambda: consume_until(200), 60, "the rest from the slave")
        assert seen == {f"m{i}".encode() for i in range(200)}  # nothing skipped

        port = int(master.address.rpartition(":")[2])
        master = start_broker(
            "--nameserver",
            nameserver.address,
            "--broker-name",
            "group-a",
            "--register-interval-ms",
            "500",
            "--store-overrides",
            ONE_MIB_FILES,
            store="master",
            port=port,
        )
        with tidemq.Producer(nameserver.address) as producer:
            for i in range(200, 250):
                assert producer.send("orders", f"m{i}").status is tidemq.SendStatus.SEND_OK
        wait_until(lambda: consume_until(250), 60, "new messages after the master returned")

        def committed_on_master() -> bool:
            # Auto-commit commits what earlier polls returned: keep polling.
            assert not c.poll(timeout_s=0.1)
            for q in range(QUEUES):
                r = master.stub().QueryConsumerOffset(
                    broker_pb2.QueryConsumerOffsetRequest(
                        group="reader", topic="orders", queue_id=q
                    ),
                    timeout=10,
                )
                end = master.stub().GetQueueOffsets(
                    broker_pb2.GetQueueOffsetsRequest(topic="orders", queue_ids=[q]), timeout=10
                )
                if not r.found or r.offset != end.queues[0].max_offset:
                    return False
            return True

        # Back on the master: the consumer commits there again, up to the end.
        wait_until(committed_on_master, 30, "the consumer's commits on the master again")
