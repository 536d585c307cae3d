"""Hypothesis throws bad pulls, lookups and undecodable bytes at one real broker process: every
one gets its gRPC status and typed ErrorDetail (never INTERNAL or UNKNOWN), nothing bad is
stored, and afterwards the broker still sends and pulls and its store checks clean.

The broker is shared by the whole module (starting one per example would take minutes); it and
the strategies are in ``bad_input``. Sends and topics: ``test_bad_input``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.bad_input import (
    INVALID,
    LONG_POLL_MAX_MS,
    METHODS,
    NOT_FOUND,
    QUEUES,
    STORED,
    Broker,
    E,
    any_text,
    assert_refused,
    bad_tag_expressions,
    is_hex,
    message_ids,
    negative_i32,
    negative_i64,
    own_host,
    raw_call,
    some,
    start_broker,
    tag_word,
    typed,
    undecodable,
)
from tests.integration.bad_input_after import assert_works_and_store_checks_clean
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from start_broker(tmp_path_factory)


# ---------------------------------------------------------------------------- pulls
@some
@given(
    field=st.sampled_from(["offset", "max_messages", "max_bytes", "long_poll_timeout_ms"]),
    value=negative_i32,
)
def test_negative_pull_numbers(broker: Broker, field: str, value: int) -> None:
    request = broker_pb2.PullMessageRequest(topic="stored", queue_id=0, **{field: value})
    assert_refused(
        lambda: broker.stub.PullMessage(request, timeout=10), INVALID, E.INVALID_ARGUMENT
    )


@some
@given(offset=negative_i64)
def test_negative_commit_offsets(broker: Broker, offset: int) -> None:
    request = broker_pb2.CommitOffsetRequest(group="g", topic="orders", offset=offset)
    assert_refused(
        lambda: broker.stub.CommitOffset(request, timeout=10), INVALID, E.INVALID_ARGUMENT
    )


@some
@given(
    offset=st.one_of(st.integers(0, STORED + 2), st.integers(0, 2**63 - 1)),
    max_messages=st.integers(0, 2**31 - 1),
    max_bytes=st.integers(0, 2**63 - 1),
)
def test_any_offset_and_size_gets_an_answer(
    broker: Broker, offset: int, max_messages: int, max_bytes: int
) -> None:
    got = broker.stub.PullMessage(
        broker_pb2.PullMessageRequest(
            topic="stored",
            queue_id=0,
            offset=offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
        ),
        timeout=10,
    )
    if offset < STORED:
        assert got.status == broker_pb2.FOUND
        assert got.messages[0].body == b"m%d" % offset
        assert 1 <= len(got.messages) <= max_messages or max_messages == 0
    elif offset == STORED:
        assert got.status == broker_pb2.NO_NEW_MESSAGE
    else:
        assert (got.status, got.next_offset) == (broker_pb2.OFFSET_OVERFLOW, STORED)


@settings(max_examples=4, deadline=None)
@given(timeout_ms=st.one_of(st.just(2**63 - 1), st.integers(LONG_POLL_MAX_MS + 1, 2**63 - 1)))
def test_absurd_long_poll_is_capped(broker: Broker, timeout_ms: int) -> None:
    started = time.monotonic()
    got = broker.stub.PullMessage(
        broker_pb2.PullMessageRequest(
            topic="orders", queue_id=QUEUES - 1, offset=0, long_poll_timeout_ms=timeout_ms
        ),
        timeout=30,
    )
    assert got.status == broker_pb2.NO_NEW_MESSAGE
    assert time.monotonic() - started < 5  # the broker's cap, not the request's years


@some
@given(expression=bad_tag_expressions())
def test_bad_tag_expressions(broker: Broker, expression: str) -> None:
    s = broker.stub
    assert_refused(
        lambda: s.PullMessage(
            broker_pb2.PullMessageRequest(topic="stored", tag_expression=expression), timeout=10
        ),
        INVALID,
        E.INVALID_TAG_EXPRESSION,
    )
    membership = broker_pb2.ConsumerGroupMembership(
        group="g",
        subscriptions=[broker_pb2.Subscription(topic="stored", tag_expression=expression)],
    )
    assert_refused(
        lambda: s.Heartbeat(
            broker_pb2.HeartbeatRequest(client_id="c", consumers=[membership]), timeout=10
        ),
        INVALID,
        E.INVALID_TAG_EXPRESSION,
    )


@some
@given(tags=st.lists(st.one_of(tag_word, st.sampled_from(["t0", "t1"])), min_size=1, max_size=3))
def test_good_tag_expressions_filter(broker: Broker, tags: list[str]) -> None:
    got = broker.stub.PullMessage(
        broker_pb2.PullMessageRequest(topic="stored", tag_expression=" || ".join(tags)),
        timeout=10,
    )
    wanted = [b"m%d" % i for i in range(STORED) if f"t{i % 2}" in tags]
    assert [m.body for m in got.messages] == wanted
    assert got.status == (broker_pb2.FOUND if wanted else broker_pb2.NO_MATCHED_MESSAGE)


# ---------------------------------------------------------------------------- lookups
@some
@given(data=st.data())
def test_message_ids(broker: Broker, data: st.DataObject) -> None:
    msg_id = data.draw(message_ids(broker))

    def view() -> Any:
        return broker.stub.ViewMessage(broker_pb2.ViewMessageRequest(msg_id=msg_id), timeout=10)

    raw = bytes.fromhex(msg_id) if is_hex(msg_id) else b""
    if len(raw) not in (16, 28):
        assert_refused(view, INVALID, E.INVALID_MESSAGE_ID)
        return
    port, offset = struct.unpack(">iq", raw[-12:])
    if not 0 <= port <= 65_535 or offset < 0:  # no message id ever holds these
        assert_refused(view, INVALID, E.INVALID_MESSAGE_ID)
    elif raw[:-8].hex() == own_host(broker) and offset in broker.stored_offsets:
        got = view().message
        assert got.body == b"m%d" % broker.stored_offsets.index(offset)
    else:
        assert_refused(view, NOT_FOUND, E.MESSAGE_NOT_FOUND)


@some
@given(
    key=st.one_of(st.just(""), any_text, st.just("k")),
    begin=st.integers(-(2**63), 2**63 - 1),
    end=st.integers(-(2**63), 2**63 - 1),
    max_messages=st.integers(-(2**31), 2**31 - 1),
)
def test_query_by_key_with_any_range(
    broker: Broker, key: str, begin: int, end: int, max_messages: int
) -> None:
    request = broker_pb2.QueryMessageRequest(
        topic="stored",
        key=key,
        begin_timestamp_ms=begin,
        end_timestamp_ms=end,
        max_messages=max_messages,
    )

    def query() -> Any:
        return broker.stub.QueryMessage(request, timeout=10)

    if not key or max_messages < 0:
        assert_refused(query, INVALID, E.INVALID_ARGUMENT)
        return
    found = query().messages
    assert all(m.topic == "stored" and key in m.keys for m in found)
    assert len(found) <= (max_messages or 32)


@some
@given(other=any_text)
def test_clients_and_groups_need_names(broker: Broker, other: str) -> None:
    s = broker.stub
    member = broker_pb2.ConsumerGroupMembership(group=other or "g")
    calls: list[Callable[[], object]] = [
        lambda: s.Heartbeat(broker_pb2.HeartbeatRequest(consumers=[member]), timeout=10),
        lambda: s.Heartbeat(
            broker_pb2.HeartbeatRequest(
                client_id=other or "c", consumers=[broker_pb2.ConsumerGroupMembership()]
            ),
            timeout=10,
        ),
        lambda: s.GetConsumerList(broker_pb2.GetConsumerListRequest(), timeout=10),
        lambda: s.CommitOffset(
            broker_pb2.CommitOffsetRequest(topic="orders", offset=1), timeout=10
        ),
        lambda: s.QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(topic=other), timeout=10
        ),
    ]
    for call in calls:
        assert_refused(call, INVALID, E.INVALID_ARGUMENT)


# ---------------------------------------------------------------------------- bytes on the wire
@some
@given(data=st.data(), method=st.sampled_from(METHODS))
def test_undecodable_requests(broker: Broker, data: st.DataObject, method: str) -> None:
    payload = data.draw(undecodable(method))
    assert_refused(lambda: raw_call(broker, method, payload), INVALID, E.INVALID_ARGUMENT)


def test_an_undecodable_request_to_a_streaming_call_gets_the_typed_error(broker: Broker) -> None:
    # A producer's transaction-check stream: a field's length runs past the message's end.
    call = lambda: raw_call(broker, "WatchTransactionChecks", b"\n\x01")  # noqa: E731
    assert_refused(call, INVALID, E.INVALID_ARGUMENT)


READ_ONLY = [
    "PullMessage",
    "QueryMessage",
    "ViewMessage",
    "GetQueueOffsets",
    "SearchOffset",
    "GetConsumerList",
    "QueryConsumerOffset",
    "ListTopics",
    "GetBrokerStatus",
]


@some
@given(method=st.sampled_from(READ_ONLY), payload=st.binary(max_size=64))
def test_random_bytes_get_an_answer_or_a_typed_error(
    broker: Broker, method: str, payload: bytes
) -> None:
    try:
        raw_call(broker, method, payload)
    except grpc.RpcError as e:
        typed(e)


# ---------------------------------------------------------------------------- afterwards
def test_afterwards_the_broker_works_and_its_store_checks_clean(broker: Broker) -> None:
    assert_works_and_store_checks_clean(broker)
