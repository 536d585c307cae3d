"""OpenTelemetry end to end: a broker started with ``--otel`` and the standard OTEL_* variables
(here the SDK's console exporter, which writes each span as JSON to the broker's log) makes its
``store`` span in the trace of the message a traced producer sent, and its ``deliver`` span in
the same trace when a consumer pulls the message; the consumer's span continues it too."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tidemq
from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.test_sdk import FAST, Cluster, _routable, broker_flags
from tests.waiting import wait_until
from tidemq.tracing import TRACE_CONTEXT

pytestmark = pytest.mark.integration

TOPIC = "traced"


def logged_spans(broker: BrokerProcess) -> list[dict[str, Any]]:
    """The spans the console exporter wrote to the broker's log: JSON objects, each starting
    on a line of its own with "{"."""
    text = broker.log()
    decoder = json.JSONDecoder()
    spans = []
    at = text.find("\n{")
    while at >= 0:
        try:
            obj, end = decoder.raw_decode(text, at + 1)
        except json.JSONDecodeError:
            end = at + 2  # a span still being written, or not a span
        else:
            if isinstance(obj, dict) and "context" in obj:
                spans.append(obj)
        at = text.find("\n{", end)
    return spans


@pytest.fixture
def traced_cluster(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> Cluster:
    # The broker inherits these; this test process never configures an SDK from them.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tidemq-test-broker")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    ns = start_nameserver()
    b = start_broker(*broker_flags(ns, "broker-a", "--otel"), store="broker-a")
    cluster = Cluster(ns, {"broker-a": b}, start_broker)
    _routable(cluster.address)
    return cluster


def test_the_brokers_store_and_deliver_spans_share_the_producers_trace(
    traced_cluster: Cluster,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    broker = traced_cluster.brokers["broker-a"]
    with tidemq.Admin(traced_cluster.address) as admin:
        admin.create_topic(TOPIC, queues=1)
    with (
        tidemq.Producer(traced_cluster.address, tracer_provider=provider) as producer,
        tracer.start_as_current_span("checkout") as app_span,
    ):
        result = producer.send(TOPIC, b"order-1")
    trace_id = f"0x{app_span.get_span_context().trace_id:032x}"
    [send] = [s for s in exporter.get_finished_spans() if s.name == f"send {TOPIC}"]

    def store_spans() -> list[dict[str, Any]]:
        return [s for s in logged_spans(broker) if s["name"] == f"store {TOPIC}"]

    wait_until(lambda: bool(store_spans()), 20, "the broker's store span in its log")
    [store] = store_spans()
    assert store["context"]["trace_id"] == trace_id
    assert store["parent_id"] == f"0x{send.context.span_id:016x}"
    assert store["attributes"]["messaging.destination.name"] == TOPIC
    assert store["attributes"]["messaging.rocketmq.send_status"] == "SEND_OK"
    assert store["resource"]["attributes"]["service.name"] == "tidemq-test-broker"

    with tidemq.Consumer(
        traced_cluster.address,
        group="traced-readers",
        topic=TOPIC,
        start_from="first",
        tracer_provider=provider,
        **FAST,
    ) as consumer:
        deadline = time.monotonic() + 20
        got: list[tidemq.ReceivedMessage] = []
        while not got and time.monotonic() < deadline:
            got = consumer.poll(max_messages=10, timeout_s=1.0)
    [message] = got
    assert message.msg_id == result.msg_id
    assert TRACE_CONTEXT in message.properties
    [receive] = [s for s in exporter.get_finished_spans() if s.name == f"receive {TOPIC}"]
    assert receive.context.trace_id == app_span.get_span_context().trace_id
    assert receive.parent is not None and receive.parent.span_id == send.context.span_id

    def deliver_spans() -> list[dict[str, Any]]:
        return [s for s in logged_spans(broker) if s["name"] == f"deliver {TOPIC}"]

    wait_until(lambda: bool(deliver_spans()), 20, "the broker's deliver span in its log")
    assert {s["context"]["trace_id"] for s in deliver_spans()} == {trace_id}
    provider.shutdown()
