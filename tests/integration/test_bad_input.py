"""Hypothesis throws bad requests at one real broker process: every one gets its gRPC status and
typed ErrorDetail (never INTERNAL or UNKNOWN), nothing bad is stored, and afterwards the broker
still sends and pulls and its store checks clean.

The broker is shared by the whole module (starting one per example would take minutes); it runs
with small limits so oversize inputs stay cheap: 4 KiB bodies, 16 messages per send, 200 ms of
long polling at most.
"""

from __future__ import annotations

import json
import re
import string
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import SMALL_STORE, BrokerProcess, free_port, spawn
from tests.integration.test_broker_operations import sample, scrape
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration

MAX_BODY_BYTES = 4096
MAX_BATCH = 16
LONG_POLL_MAX_MS = 200
PROPERTIES_MAX_BYTES = 32_767 - 20  # the record CRC property takes 20 of the 32767
QUEUES = 4
STORED = 6  # messages in "stored", the topic the lookups are about

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
E = common_pb2

# Moderate example counts: the whole module, broker start and store check included, must stay
# well under a minute on a shared machine.
some = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Broker:
    process: BrokerProcess
    metrics: str
    # CommitLog offset of each message of "stored", queue 0, in queue order.
    stored_offsets: list[int]
    # CommitLog end once the fixtures were written: nothing refused may move it.
    baseline_end: int

    @property
    def stub(self) -> broker_pb2_grpc.BrokerStub:
        return self.process.stub()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp("bad-input")
    config = tmp / "broker.toml"
    config.write_text(f"long_poll_max_ms = {LONG_POLL_MAX_MS}\nmax_batch_messages = {MAX_BATCH}\n")
    overrides = {**json.loads(SMALL_STORE), "max_message_body_bytes": MAX_BODY_BYTES}
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    store_dir = tmp / "store"
    log_path = tmp / "broker.log"
    args = ["broker", "--config", str(config), "--listen", address, "--store", str(store_dir)]
    args += ["--store-overrides", json.dumps(overrides), "--metrics-listen", metrics]
    b = BrokerProcess(spawn(args, log_path), address, log_path, store_dir=store_dir)
    try:
        b.wait_serving()
        yield _prepare(b, metrics)
    except BaseException:
        print(f"----- {log_path.name} -----\n{b.log()}")
        raise
    finally:
        if b.proc.poll() is None:
            b.terminate()


def _prepare(b: BrokerProcess, metrics: str) -> Broker:
    stub = b.stub()
    for topic, queues, perm in [
        ("orders", QUEUES, 6),
        ("readonly", QUEUES, 4),
        ("writeonly", QUEUES, 2),
        ("stored", 1, 6),
    ]:
        stub.CreateTopic(
            broker_pb2.CreateTopicRequest(
                topic=common_pb2.TopicConfig(
                    topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm
                )
            ),
            timeout=10,
        )
    sent = stub.SendMessage(
        broker_pb2.SendMessageRequest(
            messages=[
                common_pb2.Message(topic="stored", body=b"m%d" % i, tag=f"t{i % 2}", keys=["k"])
                for i in range(STORED)
            ]
        ),
        timeout=10,
    )
    deadline = time.monotonic() + 20
    while True:  # until dispatch made them readable (the pull itself waits for that)
        got = stub.PullMessage(
            broker_pb2.PullMessageRequest(
                topic="stored", queue_id=0, offset=0, long_poll_timeout_ms=LONG_POLL_MAX_MS
            ),
            timeout=10,
        )
        if len(got.messages) == STORED:
            break
        assert time.monotonic() < deadline, "the fixture messages never became readable"
    end = stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    return Broker(
        b, metrics, [r.commitlog_offset for r in sent.results], end.store.commitlog_max_offset
    )


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, Any]:
    """The status and ErrorDetail of a call that must fail with a typed, non-internal error."""
    try:
        call()
    except grpc.RpcError as e:
        return typed(e)
    raise AssertionError("the call succeeded")


def typed(e: grpc.RpcError) -> tuple[grpc.StatusCode, Any]:
    status = e.code()
    assert status not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), e.details()
    detail = detail_from_metadata(e.trailing_metadata())
    assert detail is not None, f"{status.name} without an ErrorDetail: {e.details()}"
    assert detail.code != E.INTERNAL and detail.message, detail
    assert not detail.retriable, detail  # bad input stays bad: retrying cannot help
    return status, detail


def assert_refused(call: Callable[[], object], status: grpc.StatusCode, code: int) -> None:
    got_status, detail = refused(call)
    assert (got_status, E.ErrorCode.Name(detail.code)) == (status, E.ErrorCode.Name(code)), (
        detail.message
    )


# ---------------------------------------------------------------------------- strategies
TOPIC_CHARS = string.ascii_letters + string.digits + "%|_-"
TOPIC_RE = re.compile(f"[{re.escape(TOPIC_CHARS)}]+")
EXISTING = {"orders", "readonly", "writeonly", "stored"}
any_text = st.text(st.characters(codec="utf-8"), max_size=30)

unknown_topics = st.text(TOPIC_CHARS, min_size=1, max_size=127).filter(lambda t: t not in EXISTING)
bad_topics = st.one_of(
    st.just(""),
    st.text(TOPIC_CHARS, min_size=128, max_size=300),
    any_text.filter(lambda t: t != "" and not TOPIC_RE.fullmatch(t)),
    # Few characters, but more than 127 bytes in UTF-8.
    st.text(st.characters(min_codepoint=0x800, max_codepoint=0xD7FF), min_size=43, max_size=60),
)
negative_i32 = st.integers(-(2**31), -1)
negative_i64 = st.integers(-(2**63), -1)
bad_queue_ids = st.one_of(negative_i32, st.integers(QUEUES, 2**31 - 1))
bad_queue_nums = st.one_of(negative_i32, st.integers(1025, 2**31 - 1))


def good_message(queue_id: int) -> common_pb2.Message:
    return common_pb2.Message(topic="orders", body=b"fine", queue_id=queue_id, tag="ok")


separators = st.sampled_from(["\x01", "\x02"])
with_separator = st.builds(lambda a, s, b: a + s + b, any_text, separators, any_text)
clean_text = any_text.map(lambda t: t.replace("\x01", "").replace("\x02", ""))
clean_name = clean_text.filter(bool)
reserved_names = st.sampled_from(["TAGS", "KEYS", "__CRC32#"])


@st.composite
def bad_messages(draw: st.DrawFn) -> tuple[dict[str, Any], grpc.StatusCode, int]:
    """One message with exactly one thing wrong, its expected status and ErrorCode."""
    fault = draw(
        st.sampled_from(
            [
                "body",
                "topic",
                "queue",
                "readonly",
                "property",
                "properties_size",
                "tag",
                "tag_size",
                "key",
                "born_timestamp",
            ]
        )
    )
    m: dict[str, Any] = {"topic": "orders", "body": b"x", "queue_id": draw(st.integers(0, 3))}
    extra = draw(st.dictionaries(clean_name.filter(lambda n: n not in ("TAGS", "KEYS")), any_text))
    if fault == "body":
        m["body"] = b"\0" * draw(st.integers(MAX_BODY_BYTES + 1, 300_000))
        return m, INVALID, E.BODY_TOO_LARGE
    if fault == "topic":
        m["topic"] = draw(st.one_of(bad_topics, unknown_topics))
        return m, NOT_FOUND, E.TOPIC_NOT_FOUND
    if fault == "queue":
        m["queue_id"] = draw(bad_queue_ids)
        return m, INVALID, E.INVALID_QUEUE_ID
    if fault == "readonly":
        m["topic"] = "readonly"
        return m, grpc.StatusCode.PERMISSION_DENIED, E.NO_PERMISSION
    if fault == "property":
        name, value = draw(
            st.one_of(
                st.tuples(with_separator, any_text),
                st.tuples(clean_name, with_separator),
                st.tuples(st.just(""), any_text),
                st.tuples(reserved_names, any_text),
            )
        )
        m["properties"] = {**extra, name: value}
        return m, INVALID, E.INVALID_PROPERTY
    if fault == "properties_size":
        # Sizes are drawn, not the text: hypothesis would spend ages shrinking 32 KiB strings.
        char = draw(st.sampled_from(["v", "é", "水"]))
        n = draw(st.integers(PROPERTIES_MAX_BYTES // len(char.encode()) + 1, 60_000))
        m["properties"] = {"big": char * n}
        return m, INVALID, E.PROPERTIES_SIZE_EXCEEDED
    if fault == "tag":
        m["tag"] = draw(with_separator)
        m["properties"] = extra
        return m, INVALID, E.INVALID_PROPERTY
    if fault == "tag_size":
        m["tag"] = "t" * draw(st.integers(PROPERTIES_MAX_BYTES, 60_000))
        return m, INVALID, E.PROPERTIES_SIZE_EXCEEDED
    if fault == "key":
        bad_key = draw(st.one_of(st.just(""), with_separator, any_text.map(lambda t: t + " ")))
        good_keys = draw(st.lists(st.text(string.ascii_letters, min_size=1, max_size=5)))
        m["keys"] = [*good_keys, bad_key]
        return m, INVALID, E.INVALID_PROPERTY
    m["born_timestamp_ms"] = draw(negative_i64)
    return m, INVALID, E.INVALID_PROPERTY


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


tag_word = st.text(string.ascii_letters + string.digits + "_-.", min_size=1, max_size=6)
blank = st.text(" \t", max_size=3)


@st.composite
def bad_tag_expressions(draw: st.DrawFn) -> str:
    words = draw(st.lists(tag_word, min_size=1, max_size=3))
    if draw(st.booleans()):
        # A blank alternative; with a single part the whole would be blank, which means "all".
        broken = draw(blank)
    else:
        word = draw(tag_word)
        at = draw(st.integers(0, len(word)))
        broken = word[:at] + "*" + word[at:]
        if len(words) == 1 and draw(st.booleans()):
            words = []  # "a*" alone is as bad as in company
    parts = [*words]
    parts.insert(draw(st.integers(0, len(parts))), broken)
    n = len(parts) - 1
    seps = draw(st.lists(st.sampled_from(["||", " || ", "||  "]), min_size=n, max_size=n))
    return parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=True))


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
@st.composite
def message_ids(draw: st.DrawFn, broker: Broker) -> str:
    kind = draw(st.sampled_from(["text", "length", "host", "offset"]))
    if kind == "text":
        return draw(any_text.filter(lambda t: not _is_hex(t)))
    if kind == "length":
        return draw(st.binary(max_size=40).filter(lambda b: len(b) not in (16, 28))).hex()
    if kind == "host":
        host = draw(st.binary(min_size=8, max_size=8) | st.binary(min_size=20, max_size=20))
    else:
        host = bytes.fromhex(_own_host(broker))
    near = st.sampled_from(broker.stored_offsets).flatmap(lambda o: st.integers(o - 3, o + 3))
    offset = draw(st.one_of(near, negative_i64, st.integers(0, 2**63 - 1)))
    return (host + struct.pack(">q", offset)).hex().upper()


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _own_host(broker: Broker) -> str:
    """Address and port as the broker's message ids carry them (its advertised address)."""
    host, port = broker.process.address.rsplit(":", 1)
    return bytes(map(int, host.split("."))).hex() + struct.pack(">i", int(port)).hex()


@some
@given(data=st.data())
def test_message_ids(broker: Broker, data: st.DataObject) -> None:
    msg_id = data.draw(message_ids(broker))

    def view() -> Any:
        return broker.stub.ViewMessage(broker_pb2.ViewMessageRequest(msg_id=msg_id), timeout=10)

    raw = bytes.fromhex(msg_id) if _is_hex(msg_id) else b""
    if len(raw) not in (16, 28):
        assert_refused(view, INVALID, E.INVALID_MESSAGE_ID)
        return
    port, offset = struct.unpack(">iq", raw[-12:])
    if not 0 <= port <= 65_535 or offset < 0:  # no message id ever holds these
        assert_refused(view, INVALID, E.INVALID_MESSAGE_ID)
    elif raw[:-8].hex() == _own_host(broker) and offset in broker.stored_offsets:
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
METHODS = [m.name for m in broker_pb2.DESCRIPTOR.services_by_name["Broker"].methods]


def _string_first(request: Any) -> str | None:
    """How to put a string at field 1 of a request: directly ("string"), inside the message
    there ("message": a Message, a TopicConfig), or not at all (None: no fields, or field 1
    holds no string, as SyncConfig's DataVersion, where bad UTF-8 bytes may parse as numbers)."""
    first = request.fields_by_number.get(1)
    if first is None:
        return None
    if first.type == first.TYPE_STRING:
        return "string"
    inner = first.message_type.fields_by_number.get(1) if first.message_type else None
    return "message" if inner is not None and inner.type == inner.TYPE_STRING else None


STRING_FIRST = {
    m.name: how
    for m in broker_pb2.DESCRIPTOR.services_by_name["Broker"].methods
    if (how := _string_first(m.input_type)) is not None
}
bad_utf8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


@st.composite
def undecodable(draw: st.DrawFn, method: str) -> bytes:
    kind = draw(
        st.sampled_from(["truncated", "wire_type", *(["utf8"] if method in STRING_FIRST else [])])
    )
    if kind == "truncated":
        # Field 1 announces more bytes than follow.
        tail = draw(st.binary(max_size=20))
        return bytes([0x0A, len(tail) + draw(st.integers(1, 100))]) + tail
    if kind == "wire_type":
        return bytes([1 << 3 | draw(st.sampled_from([6, 7]))]) + draw(st.binary(max_size=8))
    text = draw(st.binary(max_size=5)) + draw(bad_utf8) + draw(st.binary(max_size=5))
    text = text if not _valid_utf8(text) else text + b"\xff"
    inner = _field(1, text)
    return _field(1, inner) if STRING_FIRST[method] == "message" else inner


def _valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def raw_call(broker: Broker, method: str, payload: bytes) -> bytes:
    call = broker.process.channel().unary_unary(f"/tidemq.v1.Broker/{method}")
    answer: bytes = call(payload, timeout=10)
    return answer


@some
@given(data=st.data(), method=st.sampled_from(METHODS))
def test_undecodable_requests(broker: Broker, data: st.DataObject, method: str) -> None:
    payload = data.draw(undecodable(method))
    assert_refused(lambda: raw_call(broker, method, payload), INVALID, E.INVALID_ARGUMENT)


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
    s = broker.stub
    status = s.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=10)
    assert status.store.commitlog_max_offset == broker.baseline_end  # nothing refused was stored
    assert status.running and status.store.writable
    sent = s.SendMessage(
        broker_pb2.SendMessageRequest(messages=[good_message(0)]), timeout=10
    ).results
    assert [r.status for r in sent] == [broker_pb2.SEND_OK]
    got = s.PullMessage(
        broker_pb2.PullMessageRequest(
            topic="orders", queue_id=0, offset=0, long_poll_timeout_ms=LONG_POLL_MAX_MS
        ),
        timeout=10,
    )
    deadline = time.monotonic() + 20
    while not got.messages and time.monotonic() < deadline:
        got = s.PullMessage(
            broker_pb2.PullMessageRequest(
                topic="orders", queue_id=0, offset=0, long_poll_timeout_ms=LONG_POLL_MAX_MS
            ),
            timeout=10,
        )
    assert [m.body for m in got.messages] == [b"fine"]

    metrics = scrape(broker.metrics)
    codes = {
        dict(labels)["code"] for name, labels in metrics if name == "tidemq_rpc_requests_total"
    }
    assert "INTERNAL" not in codes
    assert sample(metrics, "tidemq_send_messages_total", topic="orders", status="SEND_OK") == 1

    assert broker.process.terminate() == 0
    log = broker.process.log()
    assert "Traceback" not in log, log
    check = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "store", "check", str(broker.process.store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "OK" in check.stdout.splitlines()[0]
    assert "shutdown:        clean" in check.stdout
