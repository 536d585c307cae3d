"""Hypothesis throws bad sends and topic requests at one real broker process: every one gets its
gRPC status and typed ErrorDetail (never INTERNAL or UNKNOWN), nothing bad is stored, and
afterwards the broker still sends and pulls and its store checks clean.

The broker is shared by the whole module (starting one per example would take minutes); it and
the strategies are in ``bad_input``. Pulls, lookups and raw bytes: ``test_bad_input_reads``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.integration.bad_input import (
    EXISTING,
    INVALID,
    MAX_BATCH,
    NOT_FOUND,
    QUEUES,
    Broker,
    E,
    assert_refused,
    bad_messages,
    bad_queue_ids,
    bad_queue_nums,
    bad_topics,
    good_message,
    negative_i32,
    some,
    start_broker,
    unknown_topics,
)
from tests.integration.bad_input_after import assert_works_and_store_checks_clean
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from start_broker(tmp_path_factory)


# ---------------------------------------------------------------------------- sends
@some
@given(
    bad=bad_messages(),
    before=st.lists(st.integers(0, QUEUES - 1), max_size=3),
    after=st.lists(st.integers(0, QUEUES - 1), max_size=3),
)
def test_a_bad_message_fails_its_whole_batch(
    broker: Broker,
    bad: tuple[dict[str, Any], grpc.StatusCode, int],
    before: list[int],
    after: list[int],
) -> None:
    fields, status, code = bad
    messages = [
        *map(good_message, before),
        common_pb2.Message(**fields),
        *map(good_message, after),
    ]
    assert_refused(
        lambda: broker.stub.SendMessage(
            broker_pb2.SendMessageRequest(messages=messages), timeout=10
        ),
        status,
        code,
    )


@pytest.mark.parametrize("name", ["TAGS", "KEYS", "__CRC32#"])
def test_reserved_property_names(broker: Broker, name: str) -> None:
    # "__CRC32#" is the store's record CRC: a client's copy must not pass for it.
    message = common_pb2.Message(topic="orders", body=b"x", properties={name: "0123456789"})
    assert_refused(
        lambda: broker.stub.SendMessage(
            broker_pb2.SendMessageRequest(messages=[message]), timeout=10
        ),
        INVALID,
        E.INVALID_PROPERTY,
    )


@some
@given(n=st.one_of(st.just(0), st.integers(MAX_BATCH + 1, 4 * MAX_BATCH)))
def test_empty_and_oversize_batches(broker: Broker, n: int) -> None:
    messages = [good_message(i % QUEUES) for i in range(n)]
    assert_refused(
        lambda: broker.stub.SendMessage(
            broker_pb2.SendMessageRequest(messages=messages), timeout=10
        ),
        INVALID,
        E.INVALID_ARGUMENT,
    )


# ---------------------------------------------------------------------------- topics
@some
@given(name=bad_topics)
def test_create_topic_refuses_bad_names(broker: Broker, name: str) -> None:
    assert_refused(
        lambda: broker.stub.CreateTopic(
            broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic=name)), timeout=10
        ),
        INVALID,
        E.INVALID_TOPIC,
    )


@some
@given(
    name=st.one_of(st.just("orders"), unknown_topics),
    numbers=st.one_of(
        st.tuples(bad_queue_nums, st.integers(0, 1024), st.integers(0, 7)),
        st.tuples(st.integers(0, 1024), bad_queue_nums, st.integers(0, 7)),
        st.tuples(
            st.integers(0, 1024),
            st.integers(0, 1024),
            st.one_of(negative_i32, st.integers(8, 2**31 - 1)),
        ),
    ),
)
def test_create_topic_refuses_bad_numbers_and_changes_nothing(
    broker: Broker, name: str, numbers: tuple[int, int, int]
) -> None:
    read, write, perm = numbers
    config = common_pb2.TopicConfig(
        topic=name, read_queue_nums=read, write_queue_nums=write, perm=perm
    )
    assert_refused(
        lambda: broker.stub.CreateTopic(broker_pb2.CreateTopicRequest(topic=config), timeout=10),
        INVALID,
        E.INVALID_TOPIC,
    )
    topics = broker.stub.ListTopics(broker_pb2.ListTopicsRequest(), timeout=10).topics
    assert {t.topic for t in topics} == EXISTING
    orders = next(t for t in topics if t.topic == "orders")
    assert (orders.read_queue_nums, orders.write_queue_nums, orders.perm) == (QUEUES, QUEUES, 6)


@some
@given(topic=st.one_of(bad_topics, unknown_topics))
def test_every_lookup_of_a_missing_topic_is_not_found(broker: Broker, topic: str) -> None:
    s = broker.stub
    calls: list[Callable[[], object]] = [
        lambda: s.PullMessage(broker_pb2.PullMessageRequest(topic=topic), timeout=10),
        lambda: s.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=10),
        lambda: s.SearchOffset(broker_pb2.SearchOffsetRequest(topic=topic), timeout=10),
        lambda: s.QueryMessage(broker_pb2.QueryMessageRequest(topic=topic, key="k"), timeout=10),
        lambda: s.CommitOffset(
            broker_pb2.CommitOffsetRequest(group="g", topic=topic, offset=1), timeout=10
        ),
        lambda: s.DeleteTopic(broker_pb2.DeleteTopicRequest(topic=topic), timeout=10),
        lambda: s.GetMessageHistory(
            broker_pb2.GetMessageHistoryRequest(topic=topic, queue_offset=0), timeout=10
        ),
    ]
    for call in calls:
        assert_refused(call, NOT_FOUND, E.TOPIC_NOT_FOUND)


@some
@given(queue_id=bad_queue_ids)
def test_queue_ids_out_of_range(broker: Broker, queue_id: int) -> None:
    s = broker.stub
    calls: list[Callable[[], object]] = [
        lambda: s.PullMessage(
            broker_pb2.PullMessageRequest(topic="orders", queue_id=queue_id), timeout=10
        ),
        lambda: s.GetQueueOffsets(
            broker_pb2.GetQueueOffsetsRequest(topic="orders", queue_ids=[0, queue_id]), timeout=10
        ),
        lambda: s.SearchOffset(
            broker_pb2.SearchOffsetRequest(topic="orders", queue_id=queue_id), timeout=10
        ),
        lambda: s.CommitOffset(
            broker_pb2.CommitOffsetRequest(group="g", topic="orders", queue_id=queue_id),
            timeout=10,
        ),
        lambda: s.GetMessageHistory(
            broker_pb2.GetMessageHistoryRequest(topic="orders", queue_id=queue_id), timeout=10
        ),
    ]
    for call in calls:
        assert_refused(call, INVALID, E.INVALID_QUEUE_ID)


def test_permissions_are_enforced(broker: Broker) -> None:
    assert_refused(
        lambda: broker.stub.PullMessage(
            broker_pb2.PullMessageRequest(topic="writeonly"), timeout=10
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        E.NO_PERMISSION,
    )


# ---------------------------------------------------------------------------- afterwards
def test_afterwards_the_broker_works_and_its_store_checks_clean(broker: Broker) -> None:
    assert_works_and_store_checks_clean(broker)
