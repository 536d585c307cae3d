"""A send of protobuf messages one by one (an older SDK, a hand-written client): the answer
says where each message is, and what is stored is what was sent, across CommitLog file
boundaries too."""

from __future__ import annotations

import grpc
import pytest

from tests.integration.conftest import StartBroker
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2

pytestmark = pytest.mark.integration

# Small CommitLog files: a few batches cross a file boundary, where a record's offset is not
# the previous one's end.
STORE = '{"commitlog_file_size_bytes": 65536}'
QUEUES = (0, 0, 2, 2, 2, 1, 0)  # runs of one queue, and a queue met again later


def batch(flag: int, round_: int) -> list[common_pb2.Message]:
    return [
        common_pb2.Message(
            topic="plain",
            queue_id=q,
            body=f"round {round_} message {i} ".encode() * (20 + 37 * i),
            tag=f"t{i % 3}" if i % 2 else "",
            keys=[f"k{round_}-{i}", "shared"] if i % 3 else [],
            properties={"trace": f"r{round_}m{i}", "empty": ""} if i != 2 else {},
            born_timestamp_ms=1_700_000_000_000 + i,
            flag=flag,
        )
        for i, q in enumerate(QUEUES)
    ]


def stored(stub: broker_pb2_grpc.BrokerStub, queue_id: int) -> list[common_pb2.StoredMessage]:
    """Every message of the queue, pulled from its start."""
    out: list[common_pb2.StoredMessage] = []
    while True:
        got = stub.PullMessage(
            broker_pb2.PullMessageRequest(
                group="g", topic="plain", queue_id=queue_id, offset=len(out)
            ),
            timeout=10,
        )
        if not got.messages:
            return out
        out += got.messages


def test_a_send_is_answered_with_where_each_message_is_and_stores_what_was_sent(
    start_broker: StartBroker,
) -> None:
    flag = 7
    b = start_broker("--store-overrides", STORE)
    with grpc.insecure_channel(b.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        config = common_pb2.TopicConfig(topic="plain", read_queue_nums=3, write_queue_nums=3)
        stub.CreateTopic(broker_pb2.CreateTopicRequest(topic=config), timeout=10)
        sent: list[tuple[common_pb2.Message, broker_pb2.SendResult]] = []
        for round_ in range(12):  # about 90 KiB: the first file fills up
            messages = batch(flag, round_)
            answer = stub.SendMessage(broker_pb2.SendMessageRequest(messages=messages), timeout=10)
            assert len(answer.results) == len(messages)
            sent += zip(messages, answer.results, strict=True)
        by_offset = {(m.queue_id, m.queue_offset): m for q in set(QUEUES) for m in stored(stub, q)}

    assert {r.status for _, r in sent} == {broker_pb2.SEND_OK}
    crossed = {r.commitlog_offset // 65536 for _, r in sent}
    assert len(crossed) > 1, "the batches stayed in one CommitLog file"
    for q in set(QUEUES):
        offsets = [r.queue_offset for m, r in sent if m.queue_id == q]
        assert offsets == list(range(len(offsets))), f"queue {q}: {offsets}"
    assert len(by_offset) == len(sent)
    for m, r in sent:
        assert r.queue_id == m.queue_id
        s = by_offset[(r.queue_id, r.queue_offset)]
        assert (s.commitlog_offset, s.msg_id) == (r.commitlog_offset, r.msg_id)
        assert (s.body, s.tag, list(s.keys), dict(s.properties)) == (
            m.body,
            m.tag,
            list(m.keys),
            dict(m.properties),
        )
        assert (s.born_timestamp_ms, s.flag) == (m.born_timestamp_ms, flag)
        assert s.born_host.startswith("127.0.0.1:")
