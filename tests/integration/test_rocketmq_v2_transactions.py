"""Transactions and recalls through a real broker's RocketMQ 5 listener: a transactional send
answers the client's id and a transaction id, EndTransaction commits or rolls back, a producer
that does not decide is asked down its Telemetry stream (recover_orphaned_transaction_command)
and its answer commits; a delayed message is recalled by its handle."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import timestamp_pb2  # type: ignore[import-untyped]

from tests.integration.conftest import BrokerProcess
from tests.integration.rocketmq_v2 import (
    V2,
    Stream,
    message,
    producer_settings,
    shared_cluster,
    v2_client,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2

pytestmark = pytest.mark.integration

TOPIC = "payments"
FAST_CHECKS = (
    *("--transaction-check-interval-ms", "300"),
    *("--transaction-timeout-ms", "300"),
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("v2-transactions")
    with shared_cluster(tmp, *FAST_CHECKS, topics={TOPIC: 2}) as (_, b):
        yield b


def keyed(broker: BrokerProcess, key: str) -> list[Any]:
    r = broker.stub().QueryMessage(
        broker_pb2.QueryMessageRequest(topic=TOPIC, key=key, max_messages=8), timeout=5
    )
    return list(r.messages)


def send_half(client: V2, key: str) -> tuple[Any, Any]:
    m = message(TOPIC, key.encode(), keys=[key], message_type=v2.TRANSACTION)
    wait_until(lambda: client.query_route(TOPIC).status.code == v2.OK, 20, f"the route of {TOPIC}")
    r = client.send(m)
    assert r.status.code == v2.OK, r.status.message
    return m, r.entries[0]


def end(client: V2, m: Any, entry: Any, resolution: int, source: int = v2.SOURCE_CLIENT) -> Any:
    return client.call(
        "EndTransaction",
        service_pb2.EndTransactionRequest(
            topic=v2.Resource(name=TOPIC),
            message_id=m.system_properties.message_id,
            transaction_id=entry.transaction_id,
            resolution=resolution,
            source=source,
        ),
    )


def test_a_committed_transaction_is_delivered_and_a_rolled_back_one_is_not(
    broker: BrokerProcess,
) -> None:
    with v2_client(broker) as client:
        m, entry = send_half(client, "tx-commit")
        assert entry.message_id == m.system_properties.message_id
        assert entry.transaction_id
        assert keyed(broker, "tx-commit") == []  # a half is invisible
        assert end(client, m, entry, v2.COMMIT).status.code == v2.OK
        wait_until(lambda: len(keyed(broker, "tx-commit")) == 1, 10, "the committed message")
        (kept,) = keyed(broker, "tx-commit")
        assert kept.properties["UNIQ_KEY"] == m.system_properties.message_id

        m2, entry2 = send_half(client, "tx-rollback")
        assert end(client, m2, entry2, v2.ROLLBACK).status.code == v2.OK
        again = end(client, m2, entry2, v2.COMMIT)  # resolved already: refused, in the body
        assert again.status.code == v2.PRECONDITION_FAILED, again.status.message
    assert keyed(broker, "tx-rollback") == []


def test_an_undecided_transaction_is_checked_on_the_producers_stream_and_its_answer_commits(
    broker: BrokerProcess,
) -> None:
    with v2_client(broker) as client:
        stream = Stream(client)
        stream.write(producer_settings(TOPIC))
        assert stream.read().status.code == v2.OK
        m, entry = send_half(client, "tx-check")
        assert end(client, m, entry, v2.TRANSACTION_RESOLUTION_UNSPECIFIED).status.code == v2.OK
        command = stream.read(timeout_s=15)
        assert command.status.code == v2.OK
        check = command.recover_orphaned_transaction_command
        assert check.transaction_id == entry.transaction_id
        assert check.message.topic.name == TOPIC
        assert check.message.body == b"tx-check"
        assert check.message.system_properties.message_id == m.system_properties.message_id
        assert check.message.system_properties.message_type == v2.TRANSACTION
        answer = end(client, check.message, check, v2.COMMIT, v2.SOURCE_SERVER_CHECK)
        assert answer.status.code == v2.OK, answer.status.message
        stream.close()
    wait_until(lambda: len(keyed(broker, "tx-check")) == 1, 10, "the message its check committed")


def test_an_unknown_transaction_id_is_a_bad_request_in_the_body(broker: BrokerProcess) -> None:
    with v2_client(broker) as client:
        m = message(TOPIC, b"x")
        bogus = service_pb2.SendResultEntry(transaction_id="not-a-transaction")
        r = end(client, m, bogus, v2.COMMIT)
        assert 40000 <= r.status.code < 50000, r.status
        missing = service_pb2.SendResultEntry(transaction_id="")
        assert end(client, m, missing, v2.COMMIT).status.code == v2.INVALID_TRANSACTION_ID


def test_a_delayed_message_is_recalled_by_its_handle_once(broker: BrokerProcess) -> None:
    at = timestamp_pb2.Timestamp()
    at.GetCurrentTime()
    at.seconds += 3600
    with v2_client(broker) as client:
        wait_until(
            lambda: client.query_route(TOPIC).status.code == v2.OK, 20, f"the route of {TOPIC}"
        )
        r = client.send(message(TOPIC, b"later", message_type=v2.DELAY, delivery_timestamp=at))
        handle = r.entries[0].recall_handle
        request = service_pb2.RecallMessageRequest(
            topic=v2.Resource(name=TOPIC), recall_handle=handle
        )
        recalled = client.call("RecallMessage", request)
        assert recalled.status.code == v2.OK, recalled.status.message
        assert recalled.message_id
        twice = client.call("RecallMessage", request)
        assert twice.status.code == v2.NOT_FOUND, twice.status
