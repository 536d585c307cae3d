"""What an operator's tooling sees of a broker process: the gRPC health service that probes and
load balancers ask, and the Prometheus ``/metrics`` endpoint."""

import signal
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import StartBroker, free_port
from tests.integration.test_broker import create_topic, error_of, send
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

BROKER_SERVICE = "tidemq.v1.Broker"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; a labelled counter nobody has touched yet has no series, which is 0."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_health_is_serving_then_not_serving_before_the_port_closes(
    start_broker: StartBroker,
) -> None:
    b = start_broker()
    health = health_pb2_grpc.HealthStub(b.channel())
    for service in ("", BROKER_SERVICE):  # "" is the whole server, what probes ask by default
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == SERVING
    watches = [
        health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
        for service in ("", BROKER_SERVICE)
    ]
    assert [next(w).status for w in watches] == [SERVING, SERVING]
    b.proc.send_signal(signal.SIGTERM)
    # Streams opened before the SIGTERM are answered by the still-open server: the change reaches
    # watchers while the port is up, so they can move away before it closes.
    assert [next(w).status for w in watches] == [NOT_SERVING, NOT_SERVING]
    for w in watches:
        w.cancel()
    assert b.terminate() == 0
    assert "Traceback" not in b.log()


def test_metrics_count_sends_and_pulls_and_show_the_store(start_broker: StartBroker) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    b = start_broker("--metrics-listen", metrics)
    stub = b.stub()
    before = scrape(metrics)
    create_topic(b, "orders", queues=2)
    bodies = [b"x", b"y" * 10, b"z" * 100]
    send(b, "orders", bodies, queue_id=0)
    send(b, "orders", [b"four"] * 4, queue_id=1)
    assert error_of(lambda: send(b, "nope", [b"lost"]))[1] == common_pb2.TOPIC_NOT_FOUND

    def dispatched() -> bool:
        got = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="orders"), timeout=10)
        return [q.max_offset for q in got.queues] == [3, 4]

    wait_until(dispatched, 20, "both sends to be readable")
    found = stub.PullMessage(
        broker_pb2.PullMessageRequest(group="g", topic="orders", queue_id=0, offset=0), timeout=10
    )
    assert found.status == broker_pb2.FOUND and len(found.messages) == 3
    at_head = stub.PullMessage(
        broker_pb2.PullMessageRequest(
            group="g", topic="orders", queue_id=0, offset=3, long_poll_timeout_ms=100
        ),
        timeout=10,
    )
    assert at_head.status == broker_pb2.NO_NEW_MESSAGE
    stub.Heartbeat(
        broker_pb2.HeartbeatRequest(
            client_id="consumer-1",
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group="g",
                    mode=broker_pb2.CLUSTERING,
                    subscriptions=[broker_pb2.Subscription(topic="orders")],
                )
            ],
        ),
        timeout=10,
    )
    stub.CommitOffset(
        broker_pb2.CommitOffsetRequest(group="g", topic="orders", queue_id=0, offset=1), timeout=10
    )

    after = scrape(metrics)

    def moved(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    rpc = "tidemq_rpc_requests_total"
    assert moved(rpc, method="SendMessage", code="OK") == 2
    assert moved(rpc, method="SendMessage", code="TOPIC_NOT_FOUND") == 1
    assert moved(rpc, method="PullMessage", code="OK") == 2
    assert moved("tidemq_send_messages_total", topic="orders", status="SEND_OK") == 7
    assert moved("tidemq_send_bytes_total", topic="orders") == 111 + 16
    assert moved("tidemq_send_latency_seconds_count") == 2
    assert moved("tidemq_pull_requests_total", topic="orders", status="FOUND") == 1
    assert moved("tidemq_pull_requests_total", topic="orders", status="NO_NEW_MESSAGE") == 1
    assert moved("tidemq_pull_messages_total", topic="orders") == 3
    assert moved("tidemq_pull_bytes_total", topic="orders") == sum(m.size for m in found.messages)
    assert moved("tidemq_pull_long_poll_waits_total") == 1
    assert sample(after, "tidemq_pull_long_poll_waiting") == 0
    # The unknown topic of the refused send got no series of its own.
    assert not [k for k in after if ("topic", "nope") in k[1]]

    assert sample(after, "tidemq_store_commitlog_max_offset_bytes") > 0
    assert sample(after, "tidemq_store_commitlog_dispatched_offset_bytes") == sample(
        after, "tidemq_store_commitlog_max_offset_bytes"
    )
    assert sample(after, "tidemq_queue_max_offset", topic="orders", queue_id="0") == 3
    assert sample(after, "tidemq_queue_max_offset", topic="orders", queue_id="1") == 4
    assert sample(after, "tidemq_topics") == 1
    assert sample(after, "tidemq_store_writable") == 1
    assert sample(after, "tidemq_consumer_clients") == 1
    assert sample(after, "tidemq_consumer_lag_messages", group="g", topic="orders") == 2
    info = [labels for name, labels in after if name == "tidemq_broker_info"]
    assert [dict(x)["address"] for x in info] == [b.address]

    assert b.terminate() == 0
    assert "Traceback" not in b.log()


def test_metrics_are_off_by_default_and_health_knows_its_services(
    start_broker: StartBroker,
) -> None:
    b = start_broker()
    assert "metrics on" not in b.log()
    reply = health_pb2_grpc.HealthStub(b.channel()).Check(
        health_pb2.HealthCheckRequest(service=BROKER_SERVICE), timeout=10
    )
    assert reply.status == SERVING
    with pytest.raises(grpc.RpcError) as e:
        health_pb2_grpc.HealthStub(b.channel()).Check(
            health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
