"""Transactions over the bare wire (no SDK): what any client of the protocol relies on. A
transactional send answers a transaction id and stores nothing consumers can see; the commit
answers the message's place in its topic, where a pull finds it once; a send without a producer
group, or straight to the half topic, is refused."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tests.integration.conftest import NameServerProcess, StartBroker
from tests.integration.receive_cluster import create_topic, routed_broker
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

TOPIC = "payments"
GROUP = "payments-producer"


def pull_all(stub: Any) -> list[bytes]:
    resp = stub.PullMessage(
        broker_pb2.PullMessageRequest(
            group="g", topic=TOPIC, queue_id=0, max_messages=32, tag_expression="*"
        )
    )
    return [m.body for m in resp.messages]


def half(stub: Any, body: bytes, group: str = GROUP) -> Any:
    return stub.SendMessage(
        broker_pb2.SendMessageRequest(
            producer_group=group,
            transactional=True,
            messages=[common_pb2.Message(topic=TOPIC, queue_id=0, body=body, tag="paid")],
        )
    ).results[0]


def test_a_transactional_send_is_invisible_until_its_commit_stores_it_once(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    stub = routed_broker(start_broker, nameserver).stub()
    create_topic(nameserver, TOPIC, queues=1)
    result = half(stub, b"wire-committed")
    assert result.status == broker_pb2.SEND_OK and result.transaction_id
    assert pull_all(stub) == []
    end = broker_pb2.EndTransactionRequest(
        producer_group=GROUP, transaction_id=result.transaction_id, resolution=broker_pb2.COMMIT
    )
    committed = stub.EndTransaction(end)
    assert committed.msg_id and committed.queue_offset == 0
    assert pull_all(stub) == [b"wire-committed"]
    with pytest.raises(grpc.RpcError) as again:
        stub.EndTransaction(end)
    assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert pull_all(stub) == [b"wire-committed"]


def test_a_transactional_send_without_its_group_and_a_send_to_the_half_topic_are_refused(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    stub = routed_broker(start_broker, nameserver).stub()
    create_topic(nameserver, TOPIC, queues=1)
    with pytest.raises(grpc.RpcError) as no_group:
        half(stub, b"no-group", group="")
    assert no_group.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as system:
        stub.SendMessage(
            broker_pb2.SendMessageRequest(
                messages=[common_pb2.Message(topic="%SYS%TRANS_HALF", body=b"forged")]
            )
        )
    assert system.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    # A message is transactional or delayed, not both (RocketMQ 5 too): refused, nothing stored.
    with pytest.raises(grpc.RpcError) as delayed:
        stub.SendMessage(
            broker_pb2.SendMessageRequest(
                producer_group=GROUP,
                transactional=True,
                messages=[common_pb2.Message(topic=TOPIC, body=b"later", delay_ms=60_000)],
            )
        )
    assert delayed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    listed = stub.ListTransactions(broker_pb2.ListTransactionsRequest(), timeout=10)
    assert listed.total == 0
    assert pull_all(stub) == []
