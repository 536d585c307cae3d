"""A client cannot make the broker build an answer of any size it likes: pulls and queries by
key stay within ``max_pull_response_bytes`` (4 MiB by default) whatever they ask, and a record
larger than that still comes, alone, so no consumer is stuck behind it."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests.integration.conftest import SMALL_STORE as STORE
from tests.integration.conftest import BrokerProcess, StartBroker
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2

pytestmark = pytest.mark.integration

CAP_BYTES = 4 << 20  # the broker's default max_pull_response_bytes
MAX_INT32 = 2**31 - 1


@pytest.fixture
def broker(start_broker: StartBroker) -> BrokerProcess:
    # CommitLog files of 16 MiB: a record of 4 MiB and more must fit one.
    b = start_broker("--store-overrides", STORE.replace("4194304", str(16 << 20), 1))
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(topic="t", read_queue_nums=1, write_queue_nums=1)
        ),
        timeout=10,
    )
    return b


@pytest.fixture
def stub(broker: BrokerProcess) -> Iterator[broker_pb2_grpc.BrokerStub]:
    # The client would accept far more than the cap: what limits the answer is the broker.
    options = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(broker.address, options=options) as channel:
        yield broker_pb2_grpc.BrokerStub(channel)


def send(stub: broker_pb2_grpc.BrokerStub, bodies: list[bytes], **fields: object) -> None:
    msgs = [common_pb2.Message(topic="t", body=b, queue_id=0, **fields) for b in bodies]
    stub.SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)


def greedy_pull(stub: broker_pb2_grpc.BrokerStub, offset: int) -> broker_pb2.PullMessageResponse:
    return stub.PullMessage(
        broker_pb2.PullMessageRequest(
            group="g", topic="t", queue_id=0, offset=offset, max_messages=MAX_INT32, max_bytes=2**40
        ),
        timeout=30,
    )


def test_a_pull_asking_for_a_terabyte_gets_at_most_the_cap_and_the_rest_on_later_pulls(
    stub: broker_pb2_grpc.BrokerStub,
) -> None:
    body = 64 * 1024
    for i in range(6):  # 96 messages of 64 KiB: 6 MiB, half again the cap
        send(stub, [bytes([i]) * body] * 16)
    first = greedy_pull(stub, 0)
    assert first.status == broker_pb2.FOUND
    got = sum(m.size for m in first.messages)
    assert body < got <= CAP_BYTES, f"{len(first.messages)} messages, {got} bytes"
    offset, seen = first.next_offset, len(first.messages)
    assert offset == seen
    while offset < 96:  # nothing is skipped: later pulls carry the rest
        r = greedy_pull(stub, offset)
        assert r.messages and sum(m.size for m in r.messages) <= CAP_BYTES
        seen += len(r.messages)
        offset = r.next_offset
    assert (offset, seen) == (96, 96)


def test_a_record_larger_than_the_cap_still_comes_alone(stub: broker_pb2_grpc.BrokerStub) -> None:
    # A 4 MiB body makes a record (headers included) just over the 4 MiB cap.
    send(stub, [b"s" * 1024])
    send(stub, [b"B" * (4 << 20)])
    send(stub, [b"s" * 1024] * 3)
    before = greedy_pull(stub, 0)
    assert [len(m.body) for m in before.messages] == [1024]
    assert before.next_offset == 1
    big = greedy_pull(stub, 1)
    assert [len(m.body) for m in big.messages] == [4 << 20]
    assert big.messages[0].size > CAP_BYTES
    assert big.next_offset == 2
    after = greedy_pull(stub, 2)
    assert [len(m.body) for m in after.messages] == [1024] * 3


def test_a_query_by_key_answers_at_most_the_cap(stub: broker_pb2_grpc.BrokerStub) -> None:
    for i in range(10):  # ten 1 MiB messages under one key: 10 MiB
        send(stub, [bytes([i]) * (1 << 20)], keys=["order-1"])
    r = stub.QueryMessage(
        broker_pb2.QueryMessageRequest(topic="t", key="order-1", max_messages=64), timeout=30
    )
    got = sum(m.size for m in r.messages)
    assert r.messages and got <= CAP_BYTES, f"{len(r.messages)} messages, {got} bytes"
