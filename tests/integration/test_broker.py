"""The broker as a user meets it: a real process over real gRPC, registered with a real
nameserver, its store on disk."""

import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.waiting import wait_until
from tests.workers import Worker
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration


def create_topic(b: BrokerProcess, topic: str, queues: int = 4) -> None:
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues
            )
        ),
        timeout=10,
    )


def send(
    b: BrokerProcess, topic: str, bodies: list[bytes], queue_id: int = 0, **kw: object
) -> list:  # type: ignore[type-arg]
    msgs = [common_pb2.Message(topic=topic, body=x, queue_id=queue_id, **kw) for x in bodies]
    return list(
        b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30).results
    )


def pull_all(b: BrokerProcess, topic: str, queue_id: int, expected: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    deadline = time.monotonic() + 20
    while len(got) < expected and time.monotonic() < deadline:
        r = b.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group="g",
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                max_messages=64,
                long_poll_timeout_ms=1000,
            ),
            timeout=10,
        )
        got += [m.body for m in r.messages]
        offset = r.next_offset
    return got


def error_of(call: object) -> tuple[grpc.StatusCode, int, bool]:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        detail = detail_from_metadata(e.trailing_metadata())
        assert detail is not None, "every error carries its typed detail"
        return e.code(), detail.code, detail.retriable
    raise AssertionError("the call succeeded")


def test_route_send_and_pull(nameserver: NameServerProcess, start_broker: StartBroker) -> None:
    b = start_broker("--nameserver", nameserver.address, "--broker-name", "b1")
    create_topic(b, "orders")

    def routed() -> bool:
        try:
            r = nameserver.stub().QueryRoute(
                nameserver_pb2.QueryRouteRequest(topic="orders"), timeout=5
            )
        except grpc.RpcError:
            return False
        return [dict(x.addresses) for x in r.brokers] == [{0: b.address}]

    wait_until(routed, 20, "the nameserver to route orders to the broker")
    bodies = [f"order-{i}".encode() for i in range(100)]
    results = send(b, "orders", bodies, queue_id=2, tag="created")
    assert [r.status for r in results] == [broker_pb2.SEND_OK] * 100
    assert [r.queue_offset for r in results] == list(range(100))
    assert pull_all(b, "orders", 2, 100) == bodies


def parked_pulls(metrics: str) -> float:
    """Pulls waiting at the head of their queue right now, as the broker's /metrics says."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return next(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tidemq_pull_long_poll_waiting"
    )


def test_long_polling_wakes_on_arrival(start_broker: StartBroker) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    b = start_broker("--metrics-listen", metrics)
    create_topic(b, "events", queues=1)
    answer: list[broker_pb2.PullMessageResponse] = []

    def poll() -> None:
        answer.append(
            b.stub().PullMessage(
                broker_pb2.PullMessageRequest(
                    group="g", topic="events", queue_id=0, offset=0, long_poll_timeout_ms=20_000
                ),
                timeout=30,
            )
        )

    poller = Worker(poll, name="poll")
    poller.start()
    # Only a pull already parked at the head of the queue proves the wake-up: sent earlier, the
    # message would simply be found by the pull's first look.
    wait_until(lambda: poller.check() and parked_pulls(metrics) == 1, 20, "the pull to park")
    assert not answer, "the pull answered before any message arrived"
    sent_at = time.monotonic()
    send(b, "events", [b"wake up"])
    poller.finish(30)
    assert answer[0].status == broker_pb2.FOUND
    assert [m.body for m in answer[0].messages] == [b"wake up"]
    assert time.monotonic() - sent_at < 10  # woken by the arrival, not by the 20 s timeout
    assert parked_pulls(metrics) == 0


def test_restart_keeps_messages_offsets_and_topics(start_broker: StartBroker) -> None:
    b = start_broker()
    create_topic(b, "orders", queues=2)
    bodies = [f"m{i}".encode() for i in range(50)]
    send(b, "orders", bodies, queue_id=1)
    b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(group="g", topic="orders", queue_id=1, offset=17), timeout=5
    )
    assert b.terminate() == 0
    assert not (b.store_dir / "abort").exists()  # a clean stop: no abnormal recovery next time
    b2 = start_broker()
    assert pull_all(b2, "orders", 1, 50) == bodies
    got = b2.stub().QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(group="g", topic="orders", queue_id=1), timeout=5
    )
    assert (got.found, got.offset) == (True, 17)
    topics = b2.stub().ListTopics(broker_pb2.ListTopicsRequest(), timeout=5).topics
    assert [(t.topic, t.read_queue_nums) for t in topics] == [("orders", 2)]


def test_sigkill_under_sync_flush_keeps_every_send_ok(start_broker: StartBroker) -> None:
    b = start_broker("--flush", "SYNC")
    create_topic(b, "ledger", queues=1)
    acked: list[bytes] = []
    for i in range(40):
        batch = [f"entry-{i}-{j}".encode() for j in range(25)]
        results = send(b, "ledger", batch)
        acked += [x for x, r in zip(batch, results, strict=True) if r.status == broker_pb2.SEND_OK]
    assert len(acked) == 1000
    b.kill()
    assert (b.store_dir / "abort").exists()
    b2 = start_broker("--flush", "SYNC")
    assert pull_all(b2, "ledger", 0, 1000) == acked
    assert b2.terminate() == 0
    check = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "store", "check", str(b2.store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_bad_input_gets_typed_errors_and_changes_nothing(start_broker: StartBroker) -> None:
    b = start_broker()
    create_topic(b, "orders", queues=2)
    stub = b.stub()

    def send_one(**fields: object) -> object:
        return lambda: stub.SendMessage(
            broker_pb2.SendMessageRequest(messages=[common_pb2.Message(**fields)]),
            timeout=10,
        )

    def pull(**fields: object) -> object:
        return lambda: stub.PullMessage(broker_pb2.PullMessageRequest(**fields), timeout=10)

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(send_one(topic="orders", body=b"x" * (4 * 1024 * 1024 + 1))) == (
        invalid,
        common_pb2.BODY_TOO_LARGE,
        False,
    )
    assert error_of(send_one(topic="bad topic", body=b"x"))[:2] == (
        grpc.StatusCode.NOT_FOUND,
        common_pb2.TOPIC_NOT_FOUND,
    )
    assert (
        error_of(send_one(topic="orders", body=b"x", queue_id=7))[1] == common_pb2.INVALID_QUEUE_ID
    )
    assert error_of(send_one(topic="orders", body=b"x", properties={"a\x01": "b"}))[1] == (
        common_pb2.INVALID_PROPERTY
    )
    assert error_of(send_one(topic="orders", body=b"x", keys=["has space"]))[1] == (
        common_pb2.INVALID_PROPERTY
    )
    assert (
        error_of(lambda: stub.SendMessage(broker_pb2.SendMessageRequest(), timeout=10))[0]
        == invalid
    )
    assert error_of(pull(group="g", topic="orders", queue_id=0, offset=-1))[:2] == (
        invalid,
        common_pb2.INVALID_ARGUMENT,
    )
    assert error_of(pull(group="g", topic="orders", queue_id=0, tag_expression="a ||"))[1] == (
        common_pb2.INVALID_TAG_EXPRESSION
    )
    assert error_of(pull(group="g", topic="nope", queue_id=0))[1] == common_pb2.TOPIC_NOT_FOUND
    assert error_of(
        lambda: stub.ViewMessage(broker_pb2.ViewMessageRequest(msg_id="zz"), timeout=10)
    )[1] == (common_pb2.INVALID_MESSAGE_ID)
    status = stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    assert status.store.commitlog_max_offset == 0  # nothing bad was stored
    assert status.running and status.store.writable
    assert [r.status for r in send(b, "orders", [b"fine"])] == [broker_pb2.SEND_OK]


def test_sigterm_unregisters_at_once(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    b = start_broker("--nameserver", nameserver.address)
    create_topic(b, "orders")

    def routed() -> bool:
        try:
            nameserver.stub().QueryRoute(
                nameserver_pb2.QueryRouteRequest(topic="orders"), timeout=5
            )
        except grpc.RpcError:
            return False
        return True

    wait_until(routed, 20, "the route to appear")
    assert b.terminate() == 0
    # Not after the 120 s expiry: the clean stop unregistered the broker.
    wait_until(lambda: not routed(), 5, "the route to disappear")
