"""Consumer groups against real broker processes over raw gRPC: one group, one consume model
(CONSUME_MODEL_MISMATCH for the other), settings an operator gets, updates, lists and deletes
(kept across a SIGKILL, copied to the slave by config sync), and the topics only the broker
writes (%SYS%, %DLQ%) refused to clients' sends, with %SYS% kept out of routes and topic lists."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.integration.replicas import create_topic, master_and_slave
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration

E = common_pb2
FAILED = grpc.StatusCode.FAILED_PRECONDITION
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, Any]:
    """The status and ErrorDetail of a call that must fail."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    e: Any = err.value
    detail = detail_from_metadata(e.trailing_metadata())
    assert detail is not None, f"{e.code()} without an ErrorDetail: {e.details()}"
    return e.code(), detail


def assert_refused(
    call: Callable[[], object], status: grpc.StatusCode, code: int, retriable: bool = False
) -> Any:
    got, detail = refused(call)
    assert (got, E.ErrorCode.Name(detail.code), detail.retriable) == (
        status,
        E.ErrorCode.Name(code),
        retriable,
    ), detail.message
    return detail


def heartbeat(b: BrokerProcess, group: str, model: int, client: str = "c1") -> Any:
    return b.stub().Heartbeat(
        broker_pb2.HeartbeatRequest(
            client_id=client,
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group=group,
                    mode=broker_pb2.CLUSTERING,
                    subscriptions=[broker_pb2.Subscription(topic="orders", tag_expression="*")],
                    model=model,
                )
            ],
        ),
        timeout=10,
    )


def pull(b: BrokerProcess, group: str) -> Any:
    return b.stub().PullMessage(
        broker_pb2.PullMessageRequest(group=group, topic="orders", queue_id=0, offset=0),
        timeout=10,
    )


def commit(b: BrokerProcess, group: str, offset: int, reset: bool = False) -> Any:
    return b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(
            group=group, topic="orders", queue_id=0, offset=offset, reset=reset
        ),
        timeout=10,
    )


def get_group(b: BrokerProcess, group: str) -> Any:
    return b.stub().GetConsumerGroup(broker_pb2.GetConsumerGroupRequest(group=group), timeout=10)


def update(b: BrokerProcess, group: str, **fields: Any) -> Any:
    return b.stub().UpdateConsumerGroup(
        broker_pb2.UpdateConsumerGroupRequest(group=group, **fields), timeout=10
    )


def members(b: BrokerProcess, group: str) -> list[str]:
    r = b.stub().GetConsumerList(broker_pb2.GetConsumerListRequest(group=group), timeout=10)
    return list(r.client_ids)


def test_a_group_of_one_model_refuses_calls_of_the_other(start_broker: StartBroker) -> None:
    b = start_broker()
    create_topic(b)
    heartbeat(b, "receivers", broker_pb2.RECEIVE)
    heartbeat(b, "pullers", broker_pb2.CONSUME_MODEL_UNSPECIFIED)  # an older client: OFFSETS

    detail = assert_refused(lambda: pull(b, "receivers"), FAILED, E.CONSUME_MODEL_MISMATCH)
    assert "tidemq consumer-group update receivers --model offsets" in detail.message
    assert_refused(lambda: commit(b, "receivers", 5), FAILED, E.CONSUME_MODEL_MISMATCH)
    for model in (broker_pb2.OFFSETS, broker_pb2.CONSUME_MODEL_UNSPECIFIED):
        assert_refused(
            lambda m=model: heartbeat(b, "receivers", m, client="c2"),  # type: ignore[misc]
            FAILED,
            E.CONSUME_MODEL_MISMATCH,
        )
    detail = assert_refused(
        lambda: heartbeat(b, "pullers", broker_pb2.RECEIVE, client="c2"),
        FAILED,
        E.CONSUME_MODEL_MISMATCH,
    )
    assert "--model receive" in detail.message
    # A refused heartbeat records nothing: c2 joined neither group.
    assert members(b, "receivers") == ["c1"]
    assert members(b, "pullers") == ["c1"]

    # The offsets group works as before; an operator's reset works for both models.
    assert pull(b, "pullers").status == broker_pb2.NO_NEW_MESSAGE
    assert commit(b, "pullers", 0).offset == 0
    assert commit(b, "receivers", 0, reset=True).offset == 0
    # Pulls without a group (a QueueReader) and of unknown groups are not refused.
    assert pull(b, "").status == broker_pb2.NO_NEW_MESSAGE
    assert pull(b, "never-seen").status == broker_pb2.NO_NEW_MESSAGE
    assert get_group(b, "receivers").group.model == broker_pb2.RECEIVE
    assert get_group(b, "pullers").group.model == broker_pb2.OFFSETS

    # An operator moves the group to the other model: pulls work, receive heartbeats do not.
    update(b, "receivers", model=broker_pb2.OFFSETS)
    assert pull(b, "receivers").status == broker_pb2.NO_NEW_MESSAGE
    assert_refused(
        lambda: heartbeat(b, "receivers", broker_pb2.RECEIVE), FAILED, E.CONSUME_MODEL_MISMATCH
    )


def test_an_operator_gets_updates_lists_and_deletes_group_settings(
    start_broker: StartBroker,
) -> None:
    b = start_broker()
    created = update(b, "billing", max_delivery_attempts=3).group
    assert (created.group, created.model) == ("billing", broker_pb2.CONSUME_MODEL_UNSPECIFIED)
    s = created.settings
    assert (s.max_delivery_attempts, s.fifo, s.consume_enabled) == (3, False, True)
    assert list(s.retry_policy.delays_ms)[:3] == [1_000, 5_000, 10_000]  # RocketMQ's levels

    policy = broker_pb2.RetryPolicy(initial_ms=200, max_ms=10_000, multiplier=2.5)
    changed = update(b, "billing", retry_policy=policy, fifo=True, consume_enabled=False).group
    assert changed.settings.max_delivery_attempts == 3  # not named: kept
    assert (changed.settings.fifo, changed.settings.consume_enabled) == (True, False)
    p = changed.settings.retry_policy
    assert (list(p.delays_ms), p.initial_ms, p.max_ms, p.multiplier) == ([], 200, 10_000, 2.5)
    assert get_group(b, "billing").group == changed

    # Bad values are refused and change nothing.
    for bad in (
        {"max_delivery_attempts": 0},
        {"max_delivery_attempts": 1001},
        {"retry_policy": broker_pb2.RetryPolicy(delays_ms=[1000, -5])},
        {"retry_policy": broker_pb2.RetryPolicy(initial_ms=100, multiplier=0.5)},
        {"model": 9},
    ):
        assert_refused(lambda f=bad: update(b, "billing", **f), INVALID, E.INVALID_ARGUMENT)  # type: ignore[misc]
    assert_refused(lambda: update(b, ""), INVALID, E.INVALID_ARGUMENT)
    assert get_group(b, "billing").group == changed

    heartbeat(b, "pullers", broker_pb2.OFFSETS)
    listed = b.stub().ListConsumerGroups(broker_pb2.ListConsumerGroupsRequest(), timeout=10)
    assert [(g.group, g.model) for g in listed.groups] == [
        ("billing", broker_pb2.CONSUME_MODEL_UNSPECIFIED),
        ("pullers", broker_pb2.OFFSETS),
    ]

    # Acknowledged settings survive kill -9.
    b.kill()
    b = start_broker()
    assert get_group(b, "billing").group == changed

    b.stub().DeleteConsumerGroup(broker_pb2.DeleteConsumerGroupRequest(group="billing"), timeout=10)
    assert_refused(lambda: get_group(b, "billing"), NOT_FOUND, E.GROUP_NOT_FOUND)
    assert_refused(
        lambda: b.stub().DeleteConsumerGroup(
            broker_pb2.DeleteConsumerGroupRequest(group="billing"), timeout=10
        ),
        NOT_FOUND,
        E.GROUP_NOT_FOUND,
    )
    listed = b.stub().ListConsumerGroups(broker_pb2.ListConsumerGroupsRequest(), timeout=10)
    assert [g.group for g in listed.groups] == ["pullers"]


def test_settings_reach_the_slave_by_config_sync(
    start_broker: StartBroker, nameserver: NameServerProcess
) -> None:
    master, slave = master_and_slave(start_broker, nameserver)
    heartbeat(master, "receivers", broker_pb2.RECEIVE)
    want = update(
        master,
        "receivers",
        max_delivery_attempts=5,
        retry_policy=broker_pb2.RetryPolicy(delays_ms=[100, 200]),
        fifo=True,
    ).group

    def slave_has(group: Any) -> bool:
        try:
            return bool(get_group(slave, group.group).group == group)
        except grpc.RpcError:
            return False

    wait_until(lambda: slave_has(want), 30, "the slave to hold the group's settings")
    # The slave refuses what its master refuses, and leaves writes to the master.
    assert_refused(lambda: pull(slave, "receivers"), FAILED, E.CONSUME_MODEL_MISMATCH)
    assert_refused(lambda: update(slave, "receivers", fifo=False), FAILED, E.NOT_MASTER, True)
    assert_refused(
        lambda: slave.stub().DeleteConsumerGroup(
            broker_pb2.DeleteConsumerGroupRequest(group="receivers"), timeout=10
        ),
        FAILED,
        E.NOT_MASTER,
        True,
    )

    paused = update(master, "receivers", consume_enabled=False).group
    wait_until(lambda: slave_has(paused), 30, "the slave to see the group paused")
    master.stub().DeleteConsumerGroup(
        broker_pb2.DeleteConsumerGroupRequest(group="receivers"), timeout=10
    )

    def slave_forgot() -> bool:
        listed = slave.stub().ListConsumerGroups(broker_pb2.ListConsumerGroupsRequest(), timeout=10)
        return "receivers" not in [g.group for g in listed.groups]

    wait_until(slave_forgot, 30, "the slave to forget the deleted group")


def test_clients_cannot_send_to_system_topics(start_broker: StartBroker) -> None:
    b = start_broker("--auto-create-topics")  # and a refused send creates no topic
    create_topic(b)
    end = b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    for topic in ("%SYS%RECEIVE_LOG", "%DLQ%billing"):
        good = common_pb2.Message(topic="orders", body=b"fine")
        bad = common_pb2.Message(topic=topic, body=b"forged")
        detail = assert_refused(
            lambda m=bad, g=good: b.stub().SendMessage(  # type: ignore[misc]
                broker_pb2.SendMessageRequest(messages=[g, m]), timeout=10
            ),
            INVALID,
            E.INVALID_TOPIC,
        )
        assert "system topic" in detail.message
    for topic in ("%SYS%RECEIVE_LOG", "%SYS%ANYTHING"):
        assert_refused(
            lambda t=topic: b.stub().CreateTopic(  # type: ignore[misc]
                broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic=t)), timeout=10
            ),
            INVALID,
            E.INVALID_TOPIC,
        )
    # Nothing was stored (the good message of each batch neither), nothing auto-created.
    after = b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    assert after.store.commitlog_max_offset == end.store.commitlog_max_offset
    listed = b.stub().ListTopics(broker_pb2.ListTopicsRequest(), timeout=10)
    assert {t.topic for t in listed.topics} == {"orders", "TBW102"}


def test_system_topics_stay_out_of_routes_and_topic_lists(
    start_broker: StartBroker, nameserver: NameServerProcess, tmp_path: Path
) -> None:
    """A broker whose topics include its own receive log (as the receive service registers it)
    and a dead-letter queue publishes and lists the dead-letter queue only."""
    config = tmp_path / "broker" / "config"
    config.mkdir(parents=True)
    topics = [
        {"topic": name, "read_queue_nums": n, "write_queue_nums": n}
        for name, n in (("orders", 4), ("%SYS%RECEIVE_LOG", 1), ("%DLQ%billing", 1))
    ]
    (config / "topics.json").write_text(json.dumps({"topics": topics}))
    b = start_broker("--nameserver", nameserver.address, "--register-interval-ms", "500")

    def route(topic: str) -> Any:
        return nameserver.stub().QueryRoute(
            nameserver_pb2.QueryRouteRequest(topic=topic), timeout=5
        )

    def published() -> bool:
        try:
            route("%DLQ%billing")
        except grpc.RpcError:
            return False
        return True

    wait_until(published, 30, "the broker's routes at the nameserver")
    assert [q.read_queue_nums for q in route("orders").queues] == [4]
    assert_refused(lambda: route("%SYS%RECEIVE_LOG"), NOT_FOUND, E.ROUTE_NOT_FOUND)
    listed = b.stub().ListTopics(broker_pb2.ListTopicsRequest(), timeout=10)
    assert {t.topic for t in listed.topics} == {"orders", "%DLQ%billing"}
