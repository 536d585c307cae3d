"""The broker that test_bad_input.py throws bad requests at, and hypothesis's strategies for them.

The broker is shared by the whole test module (starting one per example would take minutes); it
runs with small limits so oversize inputs stay cheap: 4 KiB bodies, 16 messages per send, 200 ms
of long polling at most. Messages of the topic "stored" are what the lookups are about.
"""

from __future__ import annotations

import json
import re
import string
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.integration.conftest import SMALL_STORE, BrokerProcess, free_port, spawn
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2
from tidemq.protos.errors import detail_from_metadata

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


def start_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The broker, ready with its topics and the messages of "stored"; stopped afterwards."""
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


@st.composite
def message_ids(draw: st.DrawFn, broker: Broker) -> str:
    kind = draw(st.sampled_from(["text", "length", "host", "offset"]))
    if kind == "text":
        return draw(any_text.filter(lambda t: not is_hex(t)))
    if kind == "length":
        return draw(st.binary(max_size=40).filter(lambda b: len(b) not in (16, 28))).hex()
    if kind == "host":
        host = draw(st.binary(min_size=8, max_size=8) | st.binary(min_size=20, max_size=20))
    else:
        host = bytes.fromhex(own_host(broker))
    near = st.sampled_from(broker.stored_offsets).flatmap(lambda o: st.integers(o - 3, o + 3))
    offset = draw(st.one_of(near, negative_i64, st.integers(0, 2**63 - 1)))
    return (host + struct.pack(">q", offset)).hex().upper()


def is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def own_host(broker: Broker) -> str:
    """Address and port as the broker's message ids carry them (its advertised address)."""
    host, port = broker.process.address.rsplit(":", 1)
    return bytes(map(int, host.split("."))).hex() + struct.pack(">i", int(port)).hex()


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
