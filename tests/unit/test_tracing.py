"""OpenTelemetry tracing without a broker: the producer's send span and the TRACE_CONTEXT
property it injects (a W3C traceparent) before a message is encoded, the consumer's spans
continuing that trace from the decoded record, the broker's store span finding the contexts in
a record block, the RocketMQ 5 adapter carrying the context both ways, and nothing at all when
no SDK is configured.

Every test uses its own TracerProvider with an InMemorySpanExporter: the global provider stays
the API's proxy, as in every other test of the session."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tidemq.consumer.consume_tracing import ConsumeTracing, consume_tracing
from tidemq.errors import RequestTimeoutError
from tidemq.producer import AsyncProducer
from tidemq.producer.blocks import Block, BlockAnswer, BlockCollector
from tidemq.producer.config import ProducerConfig
from tidemq.producer.futures import Hub, MessageFuture
from tidemq.producer.pending import Pending
from tidemq.producer.send_tracing import SendTracing, TracedBlockCollector
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.record_blocks import decode_records
from tidemq.protos.rocketmq import definition_pb2
from tidemq.routes import MessageQueue
from tidemq.services.broker import tracing as broker_tracing
from tidemq.services.broker.rocketmq.messages import stored_to_v2, to_ours
from tidemq.tracing import TRACE_CONTEXT, context_of, tracer_of
from tidemq.types import ReceivedMessage, SendStatus

# Version 00; the flags: sampled (01), and level 2's random trace id (02) from newer SDKs.
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class Loop:
    """An event loop on a thread of its own, as a producer's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def _collector(loop: Loop, tracing: SendTracing | None, handed: list[Block]) -> BlockCollector:
    args = (ProducerConfig(), Hub(), loop.loop, handed.append, lambda: False)
    if tracing is None:
        return BlockCollector(*args)
    return TracedBlockCollector(tracing, *args)


def _sealed(collector: BlockCollector, loop: Loop, handed: list[Block]) -> Block:
    done = threading.Event()

    def take() -> None:
        collector.take_open()
        done.set()

    loop.loop.call_soon_threadsafe(take)
    assert done.wait(10)
    [block] = handed
    block.queue = MessageQueue("orders", "broker-a", 3)
    return block


def _decoded(block: Block) -> list[ReceivedMessage]:
    common = {
        "broker": "broker-a",
        "receipt_handle": "",
        "delivery_attempt": 0,
        "message_group": None,
        "invisible_until_ms": 0,
    }
    return list(decode_records(ReceivedMessage, common, block.records()))


def _answer(block: Block) -> BlockAnswer:
    return BlockAnswer(
        SendStatus.SEND_OK, "broker-a", 1, "127.0.0.1:1", b"\x7f\x00\x00\x01", 1, 5, 4096,
        0, 0, [], [], False,
    )  # fmt: skip


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def test_a_producers_send_span_is_continued_by_the_consumers_span_through_the_records_property(
    spans: tuple[TracerProvider, InMemorySpanExporter], loop: Loop
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("app")
    handed: list[Block] = []
    collector = _collector(loop, SendTracing(tracer, "shop"), handed)
    with tracer.start_as_current_span("checkout") as app_span:
        future = collector.add("orders", b"order-1", "created", ["k1"], {"src": "web"})
    block = _sealed(collector, loop, handed)
    [message] = _decoded(block)  # what the broker stores and a consumer reads
    block.resolve(_answer(block))
    assert future.result(0).queue_offset == 5

    send = _one(exporter, "send orders")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == app_span.get_span_context().span_id
    assert send.attributes is not None
    assert send.attributes["messaging.system"] == "rocketmq"
    assert send.attributes["messaging.destination.name"] == "orders"
    assert send.attributes["messaging.rocketmq.client_group"] == "shop"
    assert send.attributes["messaging.message.id"] == future.result(0).msg_id
    assert message.properties["src"] == "web"

    ConsumeTracing(tracer, "billing").received([message])
    receive = _one(exporter, "receive orders")
    assert receive.kind is SpanKind.CONSUMER
    assert receive.context.trace_id == send.context.trace_id == app_span.get_span_context().trace_id
    assert receive.parent is not None and receive.parent.span_id == send.context.span_id
    assert receive.attributes is not None
    assert receive.attributes["messaging.consumer.group.name"] == "billing"


def test_the_trace_context_property_is_the_send_spans_w3c_traceparent(
    spans: tuple[TracerProvider, InMemorySpanExporter], loop: Loop
) -> None:
    provider, exporter = spans
    handed: list[Block] = []
    collector = _collector(loop, SendTracing(provider.get_tracer("t"), "g"), handed)
    collector.add("orders", b"x", None, (), None)
    [message] = _decoded(_sealed(collector, loop, handed))
    block = handed[0]
    block.resolve(_answer(block))
    send = _one(exporter, "send orders")
    value = message.properties[TRACE_CONTEXT]
    match = TRACEPARENT.match(value)
    assert match is not None, value
    assert int(match.group(1), 16) == send.context.trace_id
    assert int(match.group(2), 16) == send.context.span_id
    assert int(match.group(3), 16) == int(send.context.trace_flags)
    assert int(match.group(3), 16) & 1  # sampled


def test_a_failed_send_ends_its_span_with_an_error(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    tracing = SendTracing(provider.get_tracer("t"), "g")
    future = MessageFuture(Hub())
    pending = Pending("orders", b"x", "", (), {"a": "b"}, future, 0.0, None)
    tracing.trace_pending(pending)
    assert pending.properties is not None and TRACE_CONTEXT in pending.properties
    assert pending.properties["a"] == "b"
    future.set_exception(RequestTimeoutError("send timed out", code="TIMEOUT"))
    send = _one(exporter, "send orders")
    assert not send.status.is_ok
    assert send.attributes is not None
    assert send.attributes["error.type"] == "RequestTimeoutError"


def test_without_an_sdk_nothing_is_injected_and_no_tracer_is_made(loop: Loop) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracer_of(None) is None
    assert consume_tracing(None, "g") is None
    producer = AsyncProducer("127.0.0.1:1")
    assert producer._tracing is None
    handed: list[Block] = []
    collector = _collector(loop, None, handed)
    collector.add("orders", b"x", None, (), {"src": "web"})
    [message] = _decoded(_sealed(collector, loop, handed))
    assert message.properties == {"src": "web"}


def test_the_broker_finds_the_contexts_in_a_record_block_and_in_an_encoded_message(
    spans: tuple[TracerProvider, InMemorySpanExporter], loop: Loop
) -> None:
    provider, _ = spans
    handed: list[Block] = []
    collector = _collector(loop, SendTracing(provider.get_tracer("t"), "g"), handed)
    for i in range(3):
        collector.add("orders", f"m{i}".encode(), None, (), None)
    block = _sealed(collector, loop, handed)
    wanted = [context_of(m.properties) for m in _decoded(block)]
    ids = [trace.get_current_span(c).get_span_context().span_id for c in wanted if c]
    found = broker_tracing.contexts_in([block.records()])
    assert [c.span_id for c in found] == ids
    stored = common_pb2.StoredMessage(
        topic="orders", properties={TRACE_CONTEXT: "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}
    )
    [one] = broker_tracing.contexts_in([stored.SerializeToString()])
    assert (one.trace_id, one.span_id) == (int("ab" * 16, 16), int("cd" * 8, 16))
    assert broker_tracing.contexts_in([block.records()], limit=2) == found[:2]
    block.resolve(_answer(block))


def test_the_brokers_store_span_continues_the_sent_messages_trace_and_links_the_others(
    spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = spans
    monkeypatch.setattr(broker_tracing, "TRACER", provider.get_tracer("broker"))
    first, second = ("00-" + f"{t:032x}-{t:016x}-01" for t in (7, 8))
    request = broker_pb2.SendMessageRequest(producer_group="shop")
    for tc in (first, second, first):
        request.messages.add(topic="orders", body=b"x", properties={TRACE_CONTEXT: tc})

    class Handler:
        @broker_tracing.traced_store
        async def SendMessage(self, request: Any, context: Any) -> Any:
            return broker_pb2.SendMessageResponse(results=[broker_pb2.SendResult()])

    asyncio.run(Handler().SendMessage(request, None))
    store = _one(exporter, "store orders")
    assert store.kind is SpanKind.SERVER
    assert store.parent is not None and (store.parent.trace_id, store.parent.span_id) == (7, 7)
    assert [(link.context.trace_id, link.context.span_id) for link in store.links] == [(8, 8)]
    assert store.attributes is not None
    assert store.attributes["messaging.batch.message_count"] == 3
    assert store.attributes["messaging.rocketmq.client_group"] == "shop"


def test_the_rocketmq_adapter_stores_trace_context_as_the_property_and_gives_it_back() -> None:
    traceparent = "00-" + "12" * 16 + "-" + "34" * 8 + "-01"
    v2 = definition_pb2.Message(topic=definition_pb2.Resource(name="orders"), body=b"x")
    v2.system_properties.message_id = "01ABC"
    v2.system_properties.trace_context = traceparent
    ours = to_ours(v2, 1 << 20).message
    assert ours.properties[TRACE_CONTEXT] == traceparent
    stored = common_pb2.StoredMessage(topic="orders", body=b"x", properties=ours.properties)
    back = stored_to_v2(stored)
    assert back.system_properties.trace_context == traceparent
    assert TRACE_CONTEXT not in back.user_properties
    # A value the store could not keep as a property is dropped, not refused.
    v2.system_properties.trace_context = "bad\x01value"
    assert TRACE_CONTEXT not in to_ours(v2, 1 << 20).message.properties


def test_an_ack_of_one_message_continues_its_trace(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    tracing = ConsumeTracing(provider.get_tracer("c"), "billing")
    traceparent = "00-" + "5" * 32 + "-" + "6" * 16 + "-01"
    message = ReceivedMessage(
        "orders", 0, 0, b"x", None, (), {TRACE_CONTEXT: traceparent}, "id-1", 0, 0, "b"
    )
    with tracing.acking([message]) as span:
        tracing.settled(span, [None])
    ack = _one(exporter, "ack orders")
    assert ack.context.trace_id == int("5" * 32, 16)
    assert ack.parent is not None and ack.parent.span_id == int("6" * 16, 16)
    assert ack.attributes is not None
    assert ack.attributes["messaging.message.id"] == "id-1"
