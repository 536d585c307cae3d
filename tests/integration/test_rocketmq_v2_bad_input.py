"""Hypothesis throws malformed, missing and hostile fields at every RPC of a real broker's
RocketMQ 5 listener, built from each request's message descriptor: every call is answered with a
v2 Status in the body (never a missing one, never INTERNAL_ERROR), or with gRPC's own
INVALID_ARGUMENT for bytes that do not decode, or UNIMPLEMENTED for the RPCs no official client
calls; the broker never dies, and afterwards it still routes and stores a good message.

One broker (no nameserver: it routes its own topics) serves the whole module."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor  # type: ignore[import-untyped]
from google.protobuf.message_factory import GetMessageClass  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import SMALL_STORE, BrokerProcess, free_port, spawn
from tests.integration.rocketmq_v2 import message
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2

pytestmark = pytest.mark.integration

SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
TOPIC = "orders"
# Names that reach deeper than random text does: real, system, dead-letter, hostile.
NAMES = [TOPIC, "g1", "%DLQ%g1", "%SYS%RECEIVE_LOG", "%RETRY%g1", "", " ", "a|b", "\x00", "x" * 300]
# Served by nobody (as with the Apache proxy): gRPC's UNIMPLEMENTED is their answer.
NOT_SERVED = {"PullMessage", "UpdateOffset", "GetOffset", "QueryOffset", "SyncLiteSubscription"}
RECEIVING = {"ReceiveMessage", "AckMessage", "ChangeInvisibleDuration"}
RECEIVING.add("ForwardMessageToDeadLetterQueue")
if importlib.util.find_spec("tidemq.services.broker.rocketmq.receiving") is None:
    NOT_SERVED |= RECEIVING  # this build serves no receiving yet
BAD_CODES = (v2.CODE_UNSPECIFIED, v2.INTERNAL_ERROR, v2.INTERNAL_SERVER_ERROR)
CALL_TIMEOUT_S = 10.0

some = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=24)
_INTS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t in _INTS:
        lo, hi = _INTS[t]
        return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1 if lo else 1, 1]))
    if t == FieldDescriptor.TYPE_STRING:
        # The existing topic a third of the time: deep enough to reach the store.
        return st.one_of(st.just(TOPIC), st.sampled_from(NAMES), text)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"x" * 70_000))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))
    return st.floats(width=32) if t == FieldDescriptor.TYPE_FLOAT else st.floats()


def _value(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return messages_of(f.message_type, depth + 1)
    return _scalar(f)


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> Any:
    cls = GetMessageClass(descriptor)
    m = cls()
    for f in descriptor.fields:
        if draw(st.integers(0, 3)) == 0:
            continue  # missing (a quarter of the time)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = (
                f.message_type.fields_by_name["key"],
                f.message_type.fields_by_name["value"],
            )
            entries = draw(st.dictionaries(_scalar(key_f), _value(value_f, depth), max_size=3))
            getattr(m, f.name).update(entries)
        elif f.is_repeated:
            values = draw(st.lists(_value(f, depth), max_size=3))
            field = getattr(m, f.name)
            for v in values:
                field.add().CopyFrom(v) if f.type == FieldDescriptor.TYPE_MESSAGE else field.append(
                    v
                )
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(m, f.name).CopyFrom(draw(_value(f, depth)))
        else:
            setattr(m, f.name, draw(_scalar(f)))
    return m


def messages_of(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any instance of ``descriptor``: each field missing or any value of its type, nested a
    few levels deep."""
    if depth > 3:
        return st.just(GetMessageClass(descriptor)())
    return _message(descriptor, depth)


@st.composite
def undecodable(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["truncated", "wire_type", "utf8"]))
    if kind == "truncated":  # field 1 announces more bytes than follow
        tail = draw(st.binary(max_size=20))
        return bytes([0x0A, len(tail) + draw(st.integers(1, 100))]) + tail
    if kind == "wire_type":  # wire types 6 and 7 do not exist
        return bytes([1 << 3 | draw(st.sampled_from([6, 7]))]) + draw(st.binary(max_size=8))
    # Field 1 is a message (Resource, Message...) in most requests: its field 2 a string.
    inner = b"\x12\x02\xff\xfe"
    return bytes([0x0A, len(inner)]) + inner


# ---------------------------------------------------------------------------- the broker
@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("v2-bad-input")
    address, v2_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    log_path = tmp / "broker.log"
    args = ["broker", "--listen", address, "--store", str(tmp / "store")]
    args += ["--rocketmq-listen", v2_address, "--store-overrides", SMALL_STORE]
    args += ["--transaction-timeout-ms", "200", "--transaction-check-interval-ms", "200"]
    b = BrokerProcess(
        spawn(args, log_path),
        address,
        log_path,
        store_dir=tmp / "store",
        rocketmq_address=v2_address,
    )
    try:
        b.wait_serving()
        b.stub().CreateTopic(
            broker_pb2.CreateTopicRequest(
                topic=common_pb2.TopicConfig(
                    topic=TOPIC, read_queue_nums=2, write_queue_nums=2, perm=6
                )
            ),
            timeout=10,
        )
        yield b
        assert b.proc.poll() is None, f"the broker died:\n{b.log()}"
        _still_works(b)
    except BaseException:
        print(f"----- {log_path.name} -----\n{b.log()}")
        raise
    finally:
        if b.proc.poll() is None:
            b.terminate()


@pytest.fixture(scope="module")
def channel(broker: BrokerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(broker.rocketmq_address) as ch:
        yield ch


METADATA = (("x-mq-client-id", "bad-input@1"),)


def _assert_answered(method: Any, response: Any) -> None:
    assert response.HasField("status") or method.name == "ReceiveMessage", response
    assert response.status.code not in BAD_CODES, (method.name, response.status)


def _call(channel: grpc.Channel, method: Any, payload: bytes, metadata: Any) -> list[Any]:
    """The answers to one call (gRPC errors are raised)."""
    path = f"/{SERVICE.full_name}/{method.name}"
    output = GetMessageClass(method.output_type).FromString
    if method.client_streaming:  # Telemetry: one command, then our side closes
        call = channel.stream_stream(path, response_deserializer=output)
        return list(call(iter([payload]), timeout=CALL_TIMEOUT_S, metadata=metadata))
    if method.server_streaming:
        call = channel.unary_stream(path, response_deserializer=output)
        return list(call(payload, timeout=CALL_TIMEOUT_S + 25, metadata=metadata))
    call = channel.unary_unary(path, response_deserializer=output)
    return [call(payload, timeout=CALL_TIMEOUT_S, metadata=metadata)]


def _outcome(channel: grpc.Channel, method: Any, payload: bytes, metadata: Any) -> Any:
    """The answers to one call, or the gRPC status code it failed with."""
    try:
        return _call(channel, method, payload, metadata)
    except grpc.RpcError as e:
        return e.code()


def _check(channel: grpc.Channel, method: Any, payload: bytes, metadata: Any, raw: bool) -> None:
    answers = _outcome(channel, method, payload, metadata)
    if method.name in NOT_SERVED:
        # Bytes that do not decode are refused before the call reaches its handler.
        refusals = {grpc.StatusCode.UNIMPLEMENTED, *([grpc.StatusCode.INVALID_ARGUMENT] * raw)}
        assert answers in refusals, (method.name, answers)
        return
    if isinstance(answers, grpc.StatusCode):
        assert raw and answers == grpc.StatusCode.INVALID_ARGUMENT, (method.name, answers)
        return
    if method.name == "ReceiveMessage":
        assert answers and answers[0].WhichOneof("content") == "status", answers
        assert answers[0].status.code not in BAD_CODES, answers[0].status
        return
    for answer in answers:
        if method.name == "Telemetry":
            # Every command the broker sends carries a status (settings answers, refusals).
            assert answer.HasField("status"), answer
            assert answer.status.code not in BAD_CODES, answer.status
        else:
            _assert_answered(method, answer)


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda m: m.name)
@some
@given(data=st.data())
def test_any_request_gets_a_status(channel: grpc.Channel, method: Any, data: st.DataObject) -> None:
    request = data.draw(messages_of(method.input_type))
    with_id = data.draw(st.integers(0, 3)) > 0 or method.name == "SendMessage"
    _check(channel, method, request.SerializeToString(), METADATA if with_id else (), raw=False)


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda m: m.name)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=undecodable())
def test_bytes_that_do_not_decode_get_invalid_argument(
    channel: grpc.Channel, method: Any, payload: bytes
) -> None:
    _check(channel, method, payload, METADATA, raw=True)


@some
@given(
    body=st.binary(min_size=1, max_size=256),
    tag=st.one_of(st.none(), text),
    keys=st.lists(text, max_size=3),
    properties=st.dictionaries(text, text, max_size=3),
    kind=st.sampled_from([v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]),
    seconds=st.integers(-(2**40), 2**40),
)
def test_hostile_message_fields_are_refused_or_stored_never_internal(
    channel: grpc.Channel,
    body: bytes,
    tag: str | None,
    keys: list[str],
    properties: dict[str, str],
    kind: int,
    seconds: int,
) -> None:
    m = message(TOPIC, body, keys=keys, message_type=kind)
    if tag is not None:
        m.system_properties.tag = tag
    m.user_properties.update(properties)
    if kind == v2.FIFO:
        m.system_properties.message_group = tag or "g"
    if kind == v2.DELAY:
        m.system_properties.delivery_timestamp.seconds = seconds
    method = SERVICE.methods_by_name["SendMessage"]
    _check(
        channel,
        method,
        service_pb2.SendMessageRequest(messages=[m]).SerializeToString(),
        METADATA,
        raw=False,
    )


def _still_works(b: BrokerProcess) -> None:
    with grpc.insecure_channel(b.rocketmq_address) as ch:
        stub = ch.unary_unary(
            f"/{SERVICE.full_name}/SendMessage",
            request_serializer=service_pb2.SendMessageRequest.SerializeToString,
            response_deserializer=service_pb2.SendMessageResponse.FromString,
        )
        r = stub(
            service_pb2.SendMessageRequest(messages=[message(TOPIC, b"after")]),
            timeout=CALL_TIMEOUT_S,
            metadata=METADATA,
        )
        assert r.status.code == v2.OK, r.status
