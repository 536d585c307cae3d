"""The RocketMQ 5 (apache.rocketmq.v2) adapter's pure parts: status codes, the settings a client
is answered, the route as v2 queues, the registration of each broker's v2 address (route table,
ZooKeeper format, config), client state and transaction checks. Messages:
``test_rocketmq_messages``."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.test_rocketmq_messages import stored
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import broker_info
from tidemq.services.broker.groups import GroupSettings
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.rocketmq import routes, settings, status
from tidemq.services.broker.rocketmq.clients import V2Clients
from tidemq.services.broker.rocketmq.sending import fifo_queue
from tidemq.services.broker.rocketmq.status import StatusError
from tidemq.services.broker.rocketmq.transactions import recover_command
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.errors import ServiceError, invalid, not_found
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import BrokerRegistration, BrokerRole, TopicQueues
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.services.nameserver.servicer import registration_from_wire
from tidemq.storage.errors import ConfigError

pytestmark = pytest.mark.unit

# ---------------------------------------------------------------- status


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (not_found("no topic", common_pb2.TOPIC_NOT_FOUND), v2.TOPIC_NOT_FOUND),
        (not_found("no group", common_pb2.GROUP_NOT_FOUND), v2.CONSUMER_GROUP_NOT_FOUND),
        (invalid("bad"), v2.BAD_REQUEST),
        (invalid("topic", common_pb2.INVALID_TOPIC), v2.ILLEGAL_TOPIC),
        (invalid("big", common_pb2.BODY_TOO_LARGE), v2.MESSAGE_BODY_TOO_LARGE),
        (invalid("props", common_pb2.PROPERTIES_SIZE_EXCEEDED), v2.MESSAGE_PROPERTIES_TOO_LARGE),
        (invalid("handle", common_pb2.INVALID_RECEIPT_HANDLE), v2.INVALID_RECEIPT_HANDLE),
        (invalid("expired", common_pb2.RECEIPT_HANDLE_EXPIRED), v2.INVALID_RECEIPT_HANDLE),
        (invalid("busy", common_pb2.BROKER_BUSY), v2.TOO_MANY_REQUESTS),
        (invalid("slave", common_pb2.NOT_MASTER), v2.FORBIDDEN),
        (invalid("perm", common_pb2.NO_PERMISSION), v2.FORBIDDEN),
        (invalid("late", common_pb2.DELAY_TOO_LONG), v2.ILLEGAL_DELIVERY_TIME),
        (invalid("tx", common_pb2.TRANSACTION_NOT_FOUND), v2.INVALID_TRANSACTION_ID),
        # Not MESSAGE_NOT_FOUND: the clients read that as an empty receive, a success.
        (not_found("gone", common_pb2.MESSAGE_NOT_FOUND), v2.NOT_FOUND),
        (invalid("bug", common_pb2.INTERNAL), v2.INTERNAL_ERROR),
    ],
)
def test_our_errors_map_to_the_code_a_client_acts_on(error: ServiceError, code: int) -> None:
    answered = status.status_of(error)
    assert answered.code == code
    assert answered.message == str(error)


def test_every_error_code_of_ours_has_a_v2_code_other_than_unspecified_and_ok() -> None:
    for value in common_pb2.ErrorCode.values():
        assert status.code_of(value) not in (v2.CODE_UNSPECIFIED, v2.OK)


def test_an_unexpected_exception_is_an_internal_error_status_not_a_crash() -> None:
    answered = status.status_of_exception(KeyError("x"))
    assert answered.code == v2.INTERNAL_ERROR
    assert "KeyError" in answered.message


def test_send_statuses_name_the_persistence_that_timed_out() -> None:
    assert status.send_status(broker_pb2.SEND_OK).code == v2.OK
    assert status.send_status(broker_pb2.FLUSH_DISK_TIMEOUT).code == v2.MASTER_PERSISTENCE_TIMEOUT
    assert status.send_status(broker_pb2.FLUSH_SLAVE_TIMEOUT).code == v2.SLAVE_PERSISTENCE_TIMEOUT
    assert status.send_status(broker_pb2.SLAVE_NOT_AVAILABLE).code == v2.HA_NOT_AVAILABLE


# ---------------------------------------------------------------- settings

LIMITS = settings.BrokerLimits(max_body_bytes=4 << 20)


def test_a_producer_is_answered_its_settings_with_the_brokers_limits() -> None:
    client = v2.Settings(client_type=v2.PRODUCER, request_timeout={"seconds": 3})
    client.publishing.topics.add(name="orders")
    client.publishing.max_body_size = 134_217_728
    client.metric.on = True
    out = settings.merge(client, LIMITS, None)
    assert out.client_type == v2.PRODUCER
    assert out.request_timeout.seconds == 3
    assert [t.name for t in out.publishing.topics] == ["orders"]
    assert out.publishing.max_body_size == 4 << 20
    assert out.publishing.validate_message_type
    assert out.backoff_policy.max_attempts == 3
    backoff = out.backoff_policy.exponential_backoff
    assert (backoff.initial.ToMilliseconds(), backoff.max.ToMilliseconds()) == (10, 1000)
    assert backoff.multiplier == 2.0
    assert not out.metric.on


def test_a_consumer_is_answered_its_groups_fifo_attempts_and_backoff() -> None:
    client = v2.Settings(client_type=v2.SIMPLE_CONSUMER)
    client.subscription.group.name = "g"
    group = GroupSettings(max_delivery_attempts=5, fifo=True)
    out = settings.merge(client, LIMITS, group)
    assert out.subscription.group.name == "g"
    assert out.subscription.fifo
    assert out.subscription.receive_batch_size == 32
    assert out.subscription.long_polling_timeout.ToMilliseconds() == 20_000
    assert out.backoff_policy.max_attempts == 5
    assert out.backoff_policy.customized_backoff.next[0].ToMilliseconds() == 1_000
    exponential = GroupSettings(retry_policy=RetryPolicy(delays_ms=(), initial_ms=500))
    out = settings.merge(client, LIMITS, exponential)
    assert out.backoff_policy.exponential_backoff.initial.ToMilliseconds() == 500
    assert out.backoff_policy.max_attempts == 16


def test_settings_with_neither_publishing_nor_subscription_are_a_bad_request() -> None:
    with pytest.raises(StatusError) as e:
        settings.merge(v2.Settings(client_type=v2.PRODUCER), LIMITS, None)
    assert e.value.code == v2.BAD_REQUEST


# ---------------------------------------------------------------- routes

TOPIC = v2.Resource(name="orders")


def route(*groups: tuple[str, int, int, int, dict[int, str]]) -> nameserver_pb2.QueryRouteResponse:
    return nameserver_pb2.QueryRouteResponse(
        topic="orders",
        queues=[
            nameserver_pb2.QueueData(broker_name=n, read_queue_nums=r, write_queue_nums=w, perm=p)
            for n, r, w, p, _ in groups
        ],
        brokers=[
            nameserver_pb2.BrokerData(broker_name=n, rocketmq_addresses=v2_addresses)
            for n, _, _, _, v2_addresses in groups
        ],
    )


def test_masters_get_read_write_queues_slaves_unusable_ones_at_their_v2_endpoints() -> None:
    r = route(("broker-a", 2, 2, 6, {0: "10.0.0.1:8081", 1: "10.0.0.2:8081"}))
    queues = routes.message_queues(TOPIC, r)
    seen = [(q.broker.name, q.broker.id, q.id, q.permission) for q in queues]
    # A slave refuses sends and receives: named (clients connect to it before it may become
    # the master), never readable (the Node.js client would receive there).
    assert seen == [
        ("broker-a", 0, 0, v2.READ_WRITE),
        ("broker-a", 0, 1, v2.READ_WRITE),
        ("broker-a", 1, 0, v2.NONE),
        ("broker-a", 1, 1, v2.NONE),
    ]
    master = queues[0].broker.endpoints
    assert master.scheme == v2.IPv4
    assert [(a.host, a.port) for a in master.addresses] == [("10.0.0.1", 8081)]
    assert list(queues[0].accept_message_types) == [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]


def test_uneven_queue_counts_permissions_and_brokers_without_v2_are_honoured() -> None:
    r = route(
        ("broker-a", 1, 3, 6, {0: "mq-a.local:8081"}),
        ("broker-b", 2, 2, 4, {0: "[::1]:8081"}),  # read only
        ("broker-c", 8, 8, 6, {}),  # serves no v2 listener
    )
    seen = [(q.broker.name, q.id, q.permission) for q in routes.message_queues(TOPIC, r)]
    assert seen == [
        ("broker-a", 0, v2.READ_WRITE),
        ("broker-a", 1, v2.WRITE),
        ("broker-a", 2, v2.WRITE),
        ("broker-b", 0, v2.READ),
        ("broker-b", 1, v2.READ),
    ]
    assert routes.endpoints("mq-a.local:8081").scheme == v2.DOMAIN_NAME
    assert routes.endpoints("[::1]:8081").addresses[0].host == "::1"


def test_a_dead_letter_queue_is_readable_never_writable() -> None:
    r = route(("broker-a", 1, 1, 6, {0: "10.0.0.1:8081"}))
    queues = routes.message_queues(v2.Resource(name="%DLQ%g"), r)
    assert [q.permission for q in queues] == [v2.READ]


def test_system_topics_are_not_found_but_dead_letter_queues_route() -> None:
    for topic in ("%SYS%RECEIVE_LOG", "%RETRY%g"):
        with pytest.raises(StatusError) as e:
            routes.check_topic(topic)
        assert e.value.code == v2.TOPIC_NOT_FOUND
    routes.check_topic("%DLQ%g")


def test_a_push_consumer_is_assigned_each_readable_master_whole() -> None:
    r = route(
        ("broker-a", 4, 4, 6, {0: "10.0.0.1:8081", 1: "10.0.0.2:8081"}),
        ("broker-b", 4, 4, 2, {0: "10.0.0.3:8081"}),  # write only
        ("broker-c", 4, 4, 6, {1: "10.0.0.4:8081"}),  # no master with v2
    )
    out = routes.assignments(TOPIC, r)
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in out] == [("broker-a", -1)]
    assert out[0].message_queue.broker.endpoints.addresses[0].host == "10.0.0.1"


def test_a_message_group_always_lands_on_the_same_queue() -> None:
    assert fifo_queue("g1", 8) == fifo_queue("g1", 8)
    assert len({fifo_queue(f"g{i}", 8) for i in range(100)}) == 8


# ---------------------------------------------------------------- registration


def registration(rocketmq_address: str) -> BrokerRegistration:
    return BrokerRegistration(
        cluster="DefaultCluster",
        broker_name="broker-a",
        broker_id=0,
        address="10.0.0.1:10911",
        ha_address="10.0.0.1:10911",
        role=BrokerRole.ASYNC_MASTER,
        epoch=0,
        topics=(TopicQueues("orders", 4, 4, 6),),
        rocketmq_address=rocketmq_address,
    )


def test_the_route_table_names_each_brokers_v2_address() -> None:
    table = RouteTable()
    table.register(registration("10.0.0.1:8081"), 0)
    slave = dataclasses.replace(
        registration("10.0.0.2:8081"),
        broker_id=1,
        address="10.0.0.2:10911",
        ha_address="",
        role=BrokerRole.SLAVE,
    )
    table.register(slave, 0)
    found = table.route("orders")
    assert found is not None
    assert found.brokers[0].rocketmq_addresses == {0: "10.0.0.1:8081", 1: "10.0.0.2:8081"}


def test_the_znode_carries_the_v2_address_and_omits_it_when_there_is_none() -> None:
    node = zk_format.BrokerNodeName("DefaultCluster", "broker-a", 0)
    with_v2 = zk_format.encode_registration(registration("10.0.0.1:8081"))
    assert b'"rocketmq_address":"10.0.0.1:8081"' in with_v2
    assert zk_format.decode_registration(node, with_v2).rocketmq_address == "10.0.0.1:8081"
    without = zk_format.encode_registration(registration(""))
    assert b"rocketmq_address" not in without
    assert zk_format.decode_registration(node, without).rocketmq_address == ""


def test_a_broker_registers_its_advertised_v2_address(tmp_path: object) -> None:
    cfg = BrokerConfig(
        store_dir=str(tmp_path),
        rocketmq_listen="0.0.0.0:8081",
        rocketmq_advertise="mq-a.example:8081",
    )
    role = RoleState.for_config(cfg.role, cfg.broker_id, False, 0)
    info = broker_info(cfg, TopicManager(str(tmp_path)), role)
    assert info.rocketmq_address == "mq-a.example:8081"
    wire = nameserver_pb2.RegisterBrokerRequest(broker=info)
    assert registration_from_wire(wire).rocketmq_address == "mq-a.example:8081"
    plain = BrokerConfig(store_dir=str(tmp_path), rocketmq_listen="127.0.0.1:8081")
    assert plain.rocketmq_advertised == "127.0.0.1:8081"
    assert BrokerConfig(store_dir=str(tmp_path)).rocketmq_advertised == ""


@pytest.mark.parametrize(
    "fields",
    [
        {"rocketmq_listen": "nowhere"},
        {"rocketmq_advertise": "h:1"},  # without a listener
        {"rocketmq_listen": "h:1", "rocketmq_advertise": "h:0"},
    ],
)
def test_bad_v2_listener_settings_are_refused(tmp_path: object, fields: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="rocketmq"):
        BrokerConfig(store_dir=str(tmp_path), **fields)  # type: ignore[arg-type]


def test_a_bad_registered_v2_address_is_refused_by_the_nameserver() -> None:
    info = common_pb2.BrokerInfo(
        identity=common_pb2.BrokerIdentity(cluster="c", broker_name="b", broker_id=0),
        address="10.0.0.1:10911",
        role=common_pb2.ASYNC_MASTER,
        rocketmq_address="not an address",
    )
    with pytest.raises(ServiceError, match="rocketmq_address"):
        registration_from_wire(nameserver_pb2.RegisterBrokerRequest(broker=info))


# ---------------------------------------------------------------- clients and checks


def test_a_check_is_the_command_the_clients_answer() -> None:
    check = broker_pb2.TransactionCheck(
        transaction_id="tx1",
        message=stored(properties={"UNIQ_KEY": "01AB", "TRAN_MSG": "true", "PGROUP": "orders"}),
        check_number=1,
    )
    command = recover_command(check)
    assert command.status.code == v2.OK
    recover = command.recover_orphaned_transaction_command
    assert recover.transaction_id == "tx1"
    assert recover.message.system_properties.message_id == "01AB"
    assert recover.message.system_properties.message_type == v2.TRANSACTION
    assert recover.message.body == b"hello"


def test_clients_keep_state_per_id_and_expire_only_without_a_stream() -> None:
    clients = V2Clients(expiry_ms=1_000)
    clients.seen("a", 0)
    streaming = clients.open_stream("b", 0)
    first_closed = streaming.stream_closed
    outbox = streaming.outbox
    assert clients.expire(5_000) == ["a"]
    assert clients.get("b") is streaming
    # A newer stream replaces the older one: what fed the old one stops.
    clients.open_stream("b", 0)
    assert first_closed.is_set()
    clients.close_stream(streaming, outbox)  # the old stream ending does not close the new one
    assert streaming.outbox is not None
    clients.close_stream(streaming, streaming.outbox)
    assert streaming.outbox is None and streaming.stream_closed.is_set()
    assert clients.expire(5_000) == ["b"]


def test_only_publishers_with_an_open_stream_are_found_for_a_topic() -> None:
    clients = V2Clients()
    producer = clients.open_stream("p", 0)
    producer.settings = settings.merge(producer_settings("orders").settings, LIMITS, None)
    idle = clients.seen("q", 0)
    idle.settings = producer.settings
    assert [c.client_id for c in clients.publishers_of("orders")] == ["p"]
    assert list(clients.publishers_of("other")) == []


def producer_settings(topic: str) -> service_pb2.TelemetryCommand:
    s = v2.Settings(client_type=v2.PRODUCER)
    s.publishing.topics.add(name=topic)
    return service_pb2.TelemetryCommand(settings=s)
