"""The RocketMQ 5 (apache.rocketmq.v2) adapter's pure parts: status codes, message conversion
both ways (golden values), the settings a client is answered, the route as v2 queues, and the
registration of each broker's v2 address (route table, ZooKeeper format, config)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib

import pytest
from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import broker_info
from tidemq.services.broker.groups import GroupSettings
from tidemq.services.broker.receive.retry_policy import RetryPolicy
from tidemq.services.broker.rocketmq import messages, routes, settings, status
from tidemq.services.broker.rocketmq.sending import fifo_queue
from tidemq.services.broker.rocketmq.status import StatusError
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.errors import ServiceError, invalid, not_found
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_table import (
    BrokerRegistration,
    BrokerRole,
    RouteTable,
    TopicQueues,
)
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


# ---------------------------------------------------------------- messages: client -> ours

MAX_BODY = 4 << 20


def client_message(**system: object) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="orders"), body=b"hello")
    m.system_properties.message_id = "01AABBCCDDEEFF000100000001"
    m.system_properties.message_type = v2.NORMAL
    m.system_properties.body_encoding = v2.IDENTITY
    m.system_properties.born_timestamp.seconds = 1_700_000_000
    for k, v in system.items():
        if isinstance(v, timestamp_pb2.Timestamp):
            getattr(m.system_properties, k).CopyFrom(v)
        elif isinstance(v, list):
            getattr(m.system_properties, k).extend(v)
        else:
            setattr(m.system_properties, k, v)
    return m


def test_a_normal_message_keeps_topic_body_tag_keys_properties_and_id() -> None:
    m = client_message(tag="TagA", keys=["order-1", "user-42"])
    m.user_properties["source"] = "smoke"
    out = messages.to_ours(m, MAX_BODY)
    assert out.message == common_pb2.Message(
        topic="orders",
        body=b"hello",
        tag="TagA",
        keys=["order-1", "user-42"],
        properties={"source": "smoke", "UNIQ_KEY": "01AABBCCDDEEFF000100000001"},
        born_timestamp_ms=1_700_000_000_000,
    )
    assert (out.message_id, out.message_type, out.message_group) == (
        "01AABBCCDDEEFF000100000001",
        v2.NORMAL,
        "",
    )


def test_a_fifo_message_carries_its_group_as_the_sharding_key() -> None:
    out = messages.to_ours(client_message(message_type=v2.FIFO, message_group="g1"), MAX_BODY)
    assert out.message.properties["__SHARDINGKEY"] == "g1"
    assert out.message_group == "g1"


def test_a_delayed_message_is_delivered_at_its_timestamp() -> None:
    at = timestamp_pb2.Timestamp(seconds=1_800_000_000, nanos=250_000_000)
    out = messages.to_ours(client_message(message_type=v2.DELAY, delivery_timestamp=at), MAX_BODY)
    assert out.message.deliver_at_ms == 1_800_000_000_250


def test_a_gzip_body_is_stored_inflated() -> None:
    m = client_message(body_encoding=v2.GZIP)
    m.body = gzip.compress(b"x" * 1000)
    assert messages.to_ours(m, MAX_BODY).message.body == b"x" * 1000


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: setattr(m, "body", b"not gzip at all"), v2.MESSAGE_CORRUPTED),
        (lambda m: setattr(m, "body", gzip.compress(b"x" * 5000)[:-12]), v2.MESSAGE_CORRUPTED),
        (lambda m: setattr(m, "body", gzip.compress(b"\0" * 20_000)), v2.MESSAGE_BODY_TOO_LARGE),
    ],
)
def test_a_corrupt_or_oversized_gzip_body_is_refused(change: object, code: int) -> None:
    m = client_message(body_encoding=v2.GZIP)
    change(m)  # type: ignore[operator]
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, 10_000)
    assert e.value.code == code


@pytest.mark.parametrize(
    ("system", "user", "code"),
    [
        ({"message_type": v2.FIFO}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_group": "g"}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.DELAY}, {}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"message_type": v2.LITE}, {}, v2.UNSUPPORTED),
        ({"tag": "a|b"}, {}, v2.ILLEGAL_MESSAGE_TAG),
        ({"tag": " "}, {}, v2.ILLEGAL_MESSAGE_TAG),
        ({"keys": [""]}, {}, v2.ILLEGAL_MESSAGE_KEY),
        ({"message_id": "x" * 200}, {}, v2.ILLEGAL_MESSAGE_ID),
        ({}, {"UNIQ_KEY": "forged"}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({}, {"__SHARDINGKEY": "g"}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"body_encoding": 7}, {}, v2.BAD_REQUEST),
    ],
)
def test_what_the_protocol_refuses_is_a_typed_status(
    system: dict[str, object], user: dict[str, str], code: int
) -> None:
    m = client_message(**system)
    m.user_properties.update(user)
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == code


def test_an_empty_body_and_a_wrong_digest_are_refused() -> None:
    m = client_message()
    m.body = b""
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == v2.MESSAGE_BODY_EMPTY
    m = client_message()
    m.system_properties.body_digest.type = v2.MD5
    m.system_properties.body_digest.checksum = "00" * 16
    with pytest.raises(StatusError) as e:
        messages.to_ours(m, MAX_BODY)
    assert e.value.code == v2.MESSAGE_CORRUPTED
    m.system_properties.body_digest.checksum = hashlib.md5(b"hello").hexdigest()  # lower case
    assert messages.to_ours(m, MAX_BODY).message.body == b"hello"


# ---------------------------------------------------------------- messages: ours -> client


def stored(**fields: object) -> common_pb2.StoredMessage:
    base: dict[str, object] = {
        "topic": "orders",
        "queue_id": 3,
        "queue_offset": 41,
        "body": b"hello",
        "tag": "TagA",
        "keys": ["order-1"],
        "properties": {"UNIQ_KEY": "01AB", "source": "smoke", "PRODUCER_SEQ": "4"},
        "msg_id": "7F00000100002A9F0000000000000000",
        "born_timestamp_ms": 1_700_000_000_123,
        "store_timestamp_ms": 1_700_000_000_456,
        "born_host": "10.1.2.3:5555",
        "store_host": "127.0.0.1:10911",
    }
    base.update(fields)
    return common_pb2.StoredMessage(**base)


def test_a_received_message_is_what_the_clients_read() -> None:
    received = broker_pb2.ReceivedMessage(message=stored(), receipt_handle="h1", delivery_attempt=2)
    out = messages.received_to_v2(received)
    sp = out.system_properties
    assert out.topic.name == "orders"
    assert out.body == b"hello"
    assert dict(out.user_properties) == {"source": "smoke"}
    assert sp.message_id == "01AB"
    assert sp.message_type == v2.NORMAL
    assert sp.tag == "TagA"
    assert list(sp.keys) == ["order-1"]
    assert (sp.born_timestamp.seconds, sp.born_timestamp.nanos) == (1_700_000_000, 123_000_000)
    assert (sp.store_timestamp.seconds, sp.store_timestamp.nanos) == (1_700_000_000, 456_000_000)
    assert sp.born_host == "10.1.2.3"
    assert sp.store_host == "127.0.0.1:10911"
    assert (sp.queue_id, sp.queue_offset) == (3, 41)
    assert sp.receipt_handle == "h1"
    assert sp.delivery_attempt == 2
    assert sp.body_encoding == v2.IDENTITY
    assert sp.body_digest.type == v2.MD5
    assert sp.body_digest.checksum == "5D41402ABC4B2A76B9719D911017C592"  # md5("hello")


def test_message_id_falls_back_to_ours_and_types_are_inferred() -> None:
    m = messages.stored_to_v2(stored(properties={}))
    assert m.system_properties.message_id == "7F00000100002A9F0000000000000000"
    fifo = messages.stored_to_v2(stored(properties={"__SHARDINGKEY": "g1"}))
    assert fifo.system_properties.message_type == v2.FIFO
    assert fifo.system_properties.message_group == "g1"
    delayed = messages.stored_to_v2(stored(properties={"TIMER_DELIVER_MS": "1800000000250"}))
    assert delayed.system_properties.message_type == v2.DELAY
    assert delayed.system_properties.delivery_timestamp.seconds == 1_800_000_000
    half = messages.stored_to_v2(stored(properties={"TRAN_MSG": "true", "PGROUP": "orders"}))
    assert half.system_properties.message_type == v2.TRANSACTION
    assert dict(half.user_properties) == {}


def test_a_dead_letter_names_its_original_topic_and_id() -> None:
    props = {"RETRY_TOPIC": "orders", "ORIGIN_MESSAGE_ID": "01AB", "UNIQ_KEY": "01AB"}
    m = messages.stored_to_v2(stored(topic="%DLQ%g", properties=props))
    assert m.system_properties.dead_letter_queue.topic == "orders"
    assert m.system_properties.dead_letter_queue.message_id == "01AB"


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


def test_masters_get_read_write_queues_slaves_read_ones_at_their_v2_endpoints() -> None:
    r = route(("broker-a", 2, 2, 6, {0: "10.0.0.1:8081", 1: "10.0.0.2:8081"}))
    queues = routes.message_queues(TOPIC, r)
    seen = [(q.broker.name, q.broker.id, q.id, q.permission) for q in queues]
    assert seen == [
        ("broker-a", 0, 0, v2.READ_WRITE),
        ("broker-a", 0, 1, v2.READ_WRITE),
        ("broker-a", 1, 0, v2.READ),
        ("broker-a", 1, 1, v2.READ),
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
