"""Record blocks end to end (issue 22): plain sends travel as blocks of CommitLog records, the
broker fills and stores them whole, every message's result is derived from the block's answer,
pulls come back as record bytes; an idempotent block sent twice is stored once; a corrupt block
is refused whole; producers and consumers from before blocks keep working beside new ones."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

import tidemq
from tests.integration.conftest import BrokerProcess
from tests.integration.receive_sdk_helpers import cluster_fixture  # noqa: F401 - the fixture
from tests.integration.test_sdk import FAST, Cluster, consume_all
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import detail_from_metadata
from tidemq.protos.record_blocks import decode_records, encode_block
from tidemq.types import ReceivedMessage

pytestmark = pytest.mark.integration

TOPIC = "blocks"


def _topic(cluster: Cluster, queues: int = 2) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic(TOPIC, queues=queues)


def test_a_burst_of_sends_travels_as_blocks_and_each_result_says_where_its_message_is(
    cluster: Cluster,
) -> None:
    _topic(cluster)
    # Bodies of 100 KiB to 300 KiB roll the test broker's 4 MiB CommitLog files inside blocks.
    bodies = [bytes([i % 251]) * (1000 + (i % 7) * 50_000) for i in range(300)]
    with tidemq.Producer(cluster.address) as producer:
        futures = [
            producer.send_async(TOPIC, b, tag=f"t{i % 3}", keys=[f"k{i}"], properties={"n": str(i)})
            for i, b in enumerate(bodies)
        ]
        results = [f.result(timeout=30) for f in futures]
        requests = producer.stats.requests
    assert all(r.status is tidemq.SendStatus.SEND_OK for r in results)
    assert requests < len(bodies) / 4, "plain sends should share requests"
    with tidemq.Consumer(cluster.address, group="g", topic=TOPIC, start_from="first") as c:
        got = consume_all(c, len(bodies))
    by_id = {m.msg_id: m for m in got}
    assert len(by_id) == len(bodies)
    for i, r in enumerate(results):
        m = by_id[r.msg_id]
        assert (m.body, m.tag, m.keys, m.properties["n"]) == (
            bodies[i],
            f"t{i % 3}",
            (f"k{i}",),
            str(i),
        )
        assert (m.queue_id, m.queue_offset, m.commitlog_offset) == (
            r.queue_id,
            r.queue_offset,
            r.commitlog_offset,
        )
    files = sorted((cluster.brokers["broker-a"].store_dir / "commitlog").iterdir())
    assert len(files) > 2, "the bodies should have filled several CommitLog files"


def _block_request(
    queue_id: int, bodies: list[bytes], producer_id: int = 0, first_sequence: int = 0
) -> Any:
    records = encode_block(TOPIC, queue_id, [(b, "", (), None, 1_700_000_000_000) for b in bodies])
    request = broker_pb2.SendMessageRequest(
        block_topic=TOPIC, producer_id=producer_id, producer_epoch=0
    )
    request.blocks.add(
        queue_id=queue_id, records=records, count=len(bodies), first_sequence=first_sequence
    )
    return request


def _queue_end(broker: BrokerProcess, queue_id: int) -> int:
    r = broker.stub().GetQueueOffsets(
        broker_pb2.GetQueueOffsetsRequest(topic=TOPIC, queue_ids=[queue_id]), timeout=10
    )
    [q] = r.queues
    return int(q.max_offset)


def test_an_idempotent_block_sent_twice_is_stored_once_and_answered_with_its_first_place(
    cluster: Cluster,
) -> None:
    _topic(cluster)
    broker = cluster.brokers["broker-a"]
    request = _block_request(1, [b"a", b"b", b"c"], producer_id=77, first_sequence=0)
    first = broker.stub().SendMessage(request, timeout=10)
    again = broker.stub().SendMessage(request, timeout=10)
    [a], [b] = first.block_results, again.block_results
    assert (a.duplicate, b.duplicate) == (False, True)
    assert (b.first_queue_offset, b.first_commitlog_offset) == (
        a.first_queue_offset,
        a.first_commitlog_offset,
    )
    assert _queue_end(broker, 1) == 3
    pulled = broker.stub().PullMessage(
        broker_pb2.PullMessageRequest(
            topic=TOPIC, queue_id=1, offset=0, max_messages=10, accept_records=True
        ),
        timeout=10,
    )
    assert pulled.record_count == 3
    messages = decode_records(ReceivedMessage, _common(), pulled.records)
    assert [m.body for m in messages] == [b"a", b"b", b"c"]


def _common() -> dict[str, Any]:
    return {
        "broker": "broker-a",
        "receipt_handle": "",
        "delivery_attempt": 0,
        "message_group": None,
        "invisible_until_ms": 0,
    }


def test_a_corrupt_block_is_refused_whole_with_a_typed_error_and_stores_nothing(
    cluster: Cluster,
) -> None:
    _topic(cluster)
    broker = cluster.brokers["broker-a"]
    request = _block_request(0, [b"good"])
    bad = bytearray(encode_block(TOPIC, 1, [(b"x" * 40, "", (), None, 1)]))
    bad[30] ^= 0xFF  # a queue offset the broker fills, set by the sender
    request.blocks.add(queue_id=1, records=bytes(bad), count=1)
    with pytest.raises(grpc.RpcError) as raised:
        broker.stub().SendMessage(request, timeout=10)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = detail_from_metadata(raised.value.trailing_metadata())
    assert detail is not None and detail.code == common_pb2.CORRUPT_BLOCK
    assert "record 0 of the block" in detail.message
    assert (_queue_end(broker, 0), _queue_end(broker, 1)) == (0, 0)
    # The broker goes on: the good block alone is stored.
    assert broker.stub().SendMessage(_block_request(0, [b"good"]), timeout=10).block_status == (
        broker_pb2.SEND_OK
    )


def test_producers_and_consumers_from_before_blocks_share_a_queue_with_new_ones(
    cluster: Cluster,
) -> None:
    _topic(cluster, queues=1)
    with (
        tidemq.Producer(cluster.address) as new,
        tidemq.Producer(cluster.address, record_blocks=False) as old,
    ):
        for i in range(40):
            (new if i % 2 else old).send(TOPIC, f"m{i}")
    broker = cluster.brokers["broker-a"]
    # A consumer from before blocks pulls messages; a new one asks for records.
    as_messages = broker.stub().PullMessage(
        broker_pb2.PullMessageRequest(topic=TOPIC, queue_id=0, offset=0, max_messages=64),
        timeout=10,
    )
    assert [m.body for m in as_messages.messages] == [f"m{i}".encode() for i in range(40)]
    assert not as_messages.records
    with tidemq.Consumer(
        cluster.address, group="g-new", topic=TOPIC, start_from="first", **FAST
    ) as c:
        got = consume_all(c, 40)
    assert [m.body for m in got] == [m.body for m in as_messages.messages]
    assert [m.msg_id for m in got] == [m.msg_id for m in as_messages.messages]
    assert [m.born_timestamp_ms for m in got] == [m.born_timestamp_ms for m in as_messages.messages]


def test_a_lone_send_leaves_at_once_and_later_ones_coalesce_while_it_is_in_flight(
    cluster: Cluster,
) -> None:
    _topic(cluster)
    with tidemq.Producer(cluster.address) as producer:
        started = time.monotonic()
        assert producer.send(TOPIC, b"alone").ok
        assert time.monotonic() - started < 2.0
        futures = [producer.send_async(TOPIC, b"x" * 100) for _ in range(5_000)]
        assert all(f.result(timeout=30).ok for f in futures)
        assert producer.stats.requests < 1 + 5_000 / 16
