"""A real broker's RocketMQ 5 listener through our own ``apache.rocketmq.v2`` stubs: the route
names the broker's v2 endpoint, Telemetry answers settings and stays open, heartbeats and
terminations, SendMessage of every type lands in the store as tidemq's own sends do, and every
refusal is a Status in the body."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.integration.receive_cluster import create_topic
from tests.integration.rocketmq_v2 import (
    V2,
    Stream,
    message,
    producer_settings,
    shared_cluster,
    v2_broker,
    v2_client,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2

pytestmark = pytest.mark.integration

TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NameServerProcess, BrokerProcess]]:
    with shared_cluster(tmp_path_factory.mktemp("v2-core"), topics={TOPIC: 4}) as both:
        yield both


@pytest.fixture
def broker(cluster: tuple[NameServerProcess, BrokerProcess]) -> BrokerProcess:
    return cluster[1]


def routed(client: V2, topic: str = TOPIC) -> Any:
    found: list[Any] = []

    def has_route() -> bool:
        r = client.query_route(topic)
        found[:] = [r]
        return bool(r.status.code == v2.OK)

    wait_until(has_route, 20, f"a v2 route of {topic}")
    return found[0]


def stored(broker: BrokerProcess, key: str, count: int = 1) -> list[Any]:
    """The messages of TOPIC indexed under ``key``, once ``count`` of them are."""
    found: list[Any] = []

    def indexed() -> bool:
        r = broker.stub().QueryMessage(
            broker_pb2.QueryMessageRequest(topic=TOPIC, key=key, max_messages=32), timeout=5
        )
        found[:] = list(r.messages)
        return len(found) >= count

    wait_until(indexed, 10, f"{count} message(s) under key {key}")
    return found


def test_the_route_names_the_brokers_v2_endpoint_with_read_write_queues(
    broker: BrokerProcess,
) -> None:
    with v2_client(broker) as client:
        route = routed(client)
    host, port = broker.rocketmq_address.rsplit(":", 1)
    assert [q.id for q in route.message_queues] == [0, 1, 2, 3]
    for q in route.message_queues:
        assert q.topic.name == TOPIC
        assert q.permission == v2.READ_WRITE
        assert (q.broker.name, q.broker.id) == ("broker-a", 0)
        assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [(host, int(port))]
        assert set(q.accept_message_types) == {v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION}


def test_unknown_and_system_topics_are_topic_not_found_in_the_body(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        for topic in ("no-such-topic", "%SYS%RECEIVE_LOG"):
            assert client.query_route(topic).status.code == v2.TOPIC_NOT_FOUND


def test_calls_without_a_client_id_are_answered_client_id_required(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        anonymous = {"metadata": ()}
        r = client.call("QueryRoute", service_pb2.QueryRouteRequest(), **anonymous)
        assert r.status.code == v2.CLIENT_ID_REQUIRED
        r = client.call("SendMessage", service_pb2.SendMessageRequest(), **anonymous)
        assert r.status.code == v2.CLIENT_ID_REQUIRED


def test_telemetry_answers_each_settings_with_the_brokers_limits_and_stays_open(
    broker: BrokerProcess,
) -> None:
    with v2_client(broker) as client:
        stream = Stream(client)
        stream.write(producer_settings(TOPIC))
        first = stream.read()
        assert first.status.code == v2.OK
        assert first.settings.publishing.max_body_size == 4 << 20  # the store's body limit
        assert [t.name for t in first.settings.publishing.topics] == [TOPIC]
        assert first.settings.backoff_policy.max_attempts == 3
        assert not first.settings.metric.on
        # Still open: heartbeats meanwhile, then the settings again, answered again.
        hb = client.call("Heartbeat", service_pb2.HeartbeatRequest(client_type=v2.PRODUCER))
        assert hb.status.code == v2.OK
        stream.write(producer_settings(TOPIC))
        assert stream.read().status.code == v2.OK
        stream.write(service_pb2.TelemetryCommand(settings=v2.Settings()))
        assert stream.read().status.code == v2.BAD_REQUEST
        assert stream.close() == []
        bye = client.call("NotifyClientTermination", service_pb2.NotifyClientTerminationRequest())
        assert bye.status.code == v2.OK


def test_a_consumers_settings_carry_its_groups_attempts(broker: BrokerProcess) -> None:
    s = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
    s.subscription.group.name = "g1"
    s.subscription.subscriptions.add(topic=v2.Resource(name=TOPIC))
    with v2_client(broker) as client:
        stream = Stream(client)
        stream.write(service_pb2.TelemetryCommand(settings=s))
        answer = stream.read()
        stream.close()
    assert answer.status.code == v2.OK
    assert answer.settings.subscription.group.name == "g1"
    assert answer.settings.subscription.receive_batch_size == 32
    assert answer.settings.backoff_policy.max_attempts == 16


def test_a_broker_stopping_ends_open_telemetry_streams_and_exits_in_time(
    start_broker: StartBroker,
) -> None:
    broker = start_broker(rocketmq=True)  # alone: Telemetry needs no route
    with v2_client(broker) as client:
        stream = Stream(client)
        stream.write(producer_settings(TOPIC))
        assert stream.read().status.code == v2.OK
        assert broker.terminate() == 0  # raises if SIGTERM is not obeyed in time


def test_a_sent_message_is_stored_with_its_id_tag_keys_and_properties(
    broker: BrokerProcess,
) -> None:
    m = message(TOPIC, b"hello", tag="TagA", keys=["order-1", "user-42"])
    m.user_properties["source"] = "smoke"
    with v2_client(broker) as client:
        routed(client)
        r = client.send(m)
    assert r.status.code == v2.OK
    assert len(r.entries) == 1
    entry = r.entries[0]
    assert entry.status.code == v2.OK
    assert entry.message_id == m.system_properties.message_id
    (kept,) = stored(broker, "order-1")
    assert kept.body == b"hello"
    assert kept.tag == "TagA"
    assert list(kept.keys) == ["order-1", "user-42"]
    assert kept.properties["source"] == "smoke"
    assert kept.properties["UNIQ_KEY"] == entry.message_id
    assert kept.queue_offset == entry.offset


def test_messages_of_one_group_land_in_one_queue_in_order(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        routed(client)
        offsets = []
        for i in range(4):
            m = message(
                TOPIC, f"f{i}".encode(), keys=["fifo"], message_type=v2.FIFO, message_group="g1"
            )
            r = client.send(m)
            assert r.status.code == v2.OK
            offsets.append(r.entries[0].offset)
    kept = stored(broker, "fifo", 4)
    assert len({k.queue_id for k in kept}) == 1
    assert offsets == sorted(offsets) == [offsets[0] + i for i in range(4)]


def test_normal_messages_spread_over_the_queues(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        routed(client)
        for _ in range(8):
            assert client.send(message(TOPIC, b"x", keys=["spread"])).status.code == v2.OK
    assert {k.queue_id for k in stored(broker, "spread", 8)} == {0, 1, 2, 3}


def test_a_delayed_send_answers_a_recall_handle_that_recalls_it_under_the_clients_id(
    broker: BrokerProcess,
) -> None:
    at = timestamp_pb2.Timestamp()
    at.GetCurrentTime()
    at.seconds += 3600
    with v2_client(broker) as client:
        routed(client)
        r = client.send(message(TOPIC, b"later", message_type=v2.DELAY, delivery_timestamp=at))
        assert r.status.code == v2.OK
        sent = r.entries[0]
        assert sent.recall_handle
        recall = service_pb2.RecallMessageRequest(
            topic=v2.Resource(name=TOPIC), recall_handle=sent.recall_handle
        )
        answer = client.call("RecallMessage", recall)
        assert answer.status.code == v2.OK
        # The id the send answered (the client's own), not the broker's record id.
        assert answer.message_id == sent.message_id
        again = client.call("RecallMessage", recall)
    assert again.status.code != v2.OK, "a recalled message is no longer pending"


@pytest.mark.parametrize(
    ("build", "code"),
    [
        (lambda: message("no-such-topic", b"x"), v2.TOPIC_NOT_FOUND),
        (lambda: message("%DLQ%g1", b"x"), v2.ILLEGAL_TOPIC),
        (lambda: message(TOPIC, b""), v2.MESSAGE_BODY_EMPTY),
        (lambda: message(TOPIC, b"x" * ((4 << 20) + 1)), v2.MESSAGE_BODY_TOO_LARGE),
        (
            lambda: message(TOPIC, b"x", message_type=v2.FIFO),
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
    ],
)
def test_a_refused_send_is_a_status_in_the_body_and_stores_nothing(
    broker: BrokerProcess, build: Callable[[], Any], code: int
) -> None:
    m = build()
    key = f"refused-{code}"
    m.system_properties.keys.append(key)
    with v2_client(broker) as client:
        routed(client)
        r = client.send(m)
        assert r.status.code == code, r.status.message
        assert client.send(message(TOPIC, b"ok", keys=[key])).status.code == v2.OK
    # Only the good one is stored (the index would show the refused one first, in order).
    assert [k.body for k in stored(broker, key)] == [b"ok"]


def test_offset_rpcs_no_client_calls_are_unimplemented(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        for name, request in (
            ("UpdateOffset", service_pb2.UpdateOffsetRequest()),
            ("GetOffset", service_pb2.GetOffsetRequest()),
            ("QueryOffset", service_pb2.QueryOffsetRequest()),
        ):
            with pytest.raises(grpc.RpcError) as e:
                client.call(name, request)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as e:
            list(client.call("PullMessage", service_pb2.PullMessageRequest()))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_brokers_on_zookeeper_route_every_group_without_a_nameserver(
    start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    zk = ("--zk", zookeeper.hosts, "--zk-root", zk_root)
    a = start_broker(*zk, "--broker-name", "broker-a", store="a", rocketmq=True)
    b = start_broker(*zk, "--broker-name", "broker-b", store="b", rocketmq=True)
    for broker in (a, b):
        broker.stub().CreateTopic(
            broker_pb2.CreateTopicRequest(
                topic=common_pb2.TopicConfig(
                    topic=TOPIC, read_queue_nums=2, write_queue_nums=2, perm=6
                )
            ),
            timeout=10,
        )
    with v2_client(a) as client:

        def both_groups() -> bool:
            r = client.query_route(TOPIC)
            return {q.broker.name for q in r.message_queues} == {"broker-a", "broker-b"}

        wait_until(both_groups, 20, "both broker groups in broker-a's v2 route")
        queues = client.query_route(TOPIC).message_queues
    where = {q.broker.name: q.broker.endpoints.addresses[0] for q in queues}
    endpoints = {name: f"{address.host}:{address.port}" for name, address in where.items()}
    assert endpoints == {"broker-a": a.rocketmq_address, "broker-b": b.rocketmq_address}


def test_a_slave_is_routed_without_usable_queues_and_refuses_sends_as_forbidden(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    # A cluster of its own: the slave would change the other tests' routes.
    v2_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=4)
    slave = v2_broker(start_broker, nameserver, "--role", "SLAVE", "--broker-id", "1", store="s1")
    with v2_client(slave) as client:

        def slave_routed() -> bool:
            r = client.query_route(TOPIC)
            return any(q.broker.id == 1 for q in r.message_queues)

        wait_until(slave_routed, 20, "the slave in the v2 route")
        queues = client.query_route(TOPIC).message_queues
        by_broker = {(q.broker.id, q.permission) for q in queues}
        assert by_broker == {(0, v2.READ_WRITE), (1, v2.NONE)}
        slave_port = {q.broker.endpoints.addresses[0].port for q in queues if q.broker.id == 1}
        assert slave_port == {int(slave.rocketmq_address.rsplit(":", 1)[1])}
        refused = client.send(message(TOPIC, b"to a slave"))
        assert refused.status.code == v2.FORBIDDEN, refused.status
