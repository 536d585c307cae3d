"""The broker's OpenTelemetry spans (docs/operations.md, "Tracing"): ``store <topic>`` around a
send's put and its durability waits, ``deliver <topic>`` when a pull or a receive hands messages
to a consumer. Each continues the trace of the messages it carries: their W3C traceparent in
the ``TRACE_CONTEXT`` property (RocketMQ's; ``tidemq.tracing`` is the clients' side).

One span per request, not per message. A batched send stores up to a thousand messages in one
put, with no Python work per record (``handlers.send_blocks``): a span per record would cost
more than the put. So a request's span is a child of the first message's context (a lone
message, the common traced case, is then simply continued) and links to the next distinct ones,
at most ``MAX_LINKS``. The contexts are found by a regular expression over the request's (or
the answer's) bytes, which runs in C and stops after ``MAX_LINKS`` matches: a stray match in a
body yields at worst a link that is not a message's.

Off unless an SDK is configured (``setup``): then ``TRACER`` is None and each handler's only
cost is reading it, once per request.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from importlib import metadata
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    Tracer,
)

from tidemq.protos import broker_pb2

log = logging.getLogger(__name__)

# RocketMQ's MessageConst.PROPERTY_TRACE_CONTEXT.
TRACE_CONTEXT = "TRACE_CONTEXT"
MAX_LINKS = 32
# A send's messages looked at for contexts (the per-message path reads their properties).
MAX_SCANNED_MESSAGES = 256
SYSTEM = "rocketmq"

# The property's value after its name, whatever separates them: 0x01 in a CommitLog record,
# a protobuf map entry's value tag and length in an encoded message.
_TRACEPARENT = re.compile(
    rb"TRACE_CONTEXT[\x00-\xff]{1,2}?([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})"
)

TRACER: Tracer | None = None

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _version() -> str:
    try:
        return metadata.version("tidemq")
    except metadata.PackageNotFoundError:
        return "0"


def setup(configure_sdk: bool) -> Tracer | None:
    """Decide, once at start-up, whether this broker traces. ``configure_sdk`` (``--otel``):
    build the SDK from the standard OTEL_* variables, unless one is configured already
    (``opentelemetry-instrument``, an embedding program). Without it, an SDK configured by
    someone else is used all the same; with none, nothing is traced."""
    global TRACER
    provider = trace.get_tracer_provider()
    unset = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    if configure_sdk and unset:
        trace.set_tracer_provider(_sdk_from_environment())
        provider = trace.get_tracer_provider()
    TRACER = None
    if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        tracer = provider.get_tracer("tidemq.broker", _version())
        if not isinstance(tracer, trace.NoOpTracer):  # OTEL_SDK_DISABLED
            TRACER = tracer
    if TRACER is not None:
        log.info("tracing: OpenTelemetry spans for stores and deliveries")
    return TRACER


def _sdk_from_environment() -> trace.TracerProvider:
    """The SDK as the OTEL_* variables describe it: OTEL_TRACES_EXPORTER (exporters by their
    registered names: otlp, console, ...; default otlp), OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_* (the batch processor), and each
    exporter's own (OTEL_EXPORTER_OTLP_ENDPOINT, ...)."""
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - optional
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    except ImportError:
        raise ValueError(
            "--otel needs the OpenTelemetry SDK: pip install opentelemetry-sdk (and an exporter, "
            "e.g. opentelemetry-exporter-otlp)"
        ) from None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "tidemq-broker"}))
    provider = TracerProvider(resource=resource)
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        found = metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
                "(otlp: pip install opentelemetry-exporter-otlp; console comes with the SDK)"
            )
        exporter = next(iter(found)).load()()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


# ---------------------------------------------------------------------- finding contexts
def contexts_in(chunks: Iterable[bytes], limit: int = MAX_LINKS) -> list[SpanContext]:
    """The distinct trace contexts found in ``chunks``, at most ``limit``."""
    found: list[SpanContext] = []
    seen: set[tuple[int, int]] = set()
    for chunk in chunks:
        for match in _TRACEPARENT.finditer(chunk):
            context = _span_context(*match.groups())
            if context is None:
                continue
            key = (context.trace_id, context.span_id)
            if key in seen:
                continue
            seen.add(key)
            found.append(context)
            if len(found) >= limit:
                return found
    return found


def _span_context(
    version: bytes, trace_id: bytes, span_id: bytes, flags: bytes
) -> SpanContext | None:
    if version == b"ff":
        return None
    t, s = int(trace_id, 16), int(span_id, 16)
    if not t or not s:
        return None
    return SpanContext(t, s, is_remote=True, trace_flags=TraceFlags(int(flags, 16) & 0xFF))


def _message_contexts(messages: Sequence[Any]) -> list[SpanContext]:
    """The contexts of a per-message send's messages (their properties are parsed already)."""
    values = []
    for m in messages[:MAX_SCANNED_MESSAGES]:
        value = m.properties.get(TRACE_CONTEXT)
        if value:
            values.append(f"{TRACE_CONTEXT}\x01{value}".encode())
    return contexts_in(values)


def _parent_and_links(contexts: Sequence[SpanContext]) -> tuple[Context | None, list[Link]]:
    if not contexts:
        return None, []
    parent = trace.set_span_in_context(NonRecordingSpan(contexts[0]))
    return parent, [Link(c) for c in contexts[1:]]


# ---------------------------------------------------------------------- spans
def traced_store(handler: F) -> F:
    """SendMessage with a ``store <topic>`` span around it when tracing is on."""

    @functools.wraps(handler)
    async def send(self: Any, request: Any, context: Any) -> Any:
        tracer = TRACER
        if tracer is None:
            return await handler(self, request, context)
        if request.blocks:
            topic = request.block_topic
            count = sum(b.count for b in request.blocks)
            contexts = contexts_in(b.records for b in request.blocks)
        else:
            topic = request.messages[0].topic if request.messages else ""
            count = len(request.messages)
            contexts = _message_contexts(request.messages)
        parent, links = _parent_and_links(contexts)
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "store",
            "messaging.destination.name": topic,
            "messaging.batch.message_count": count,
            "messaging.rocketmq.client_group": request.producer_group,
        }
        with tracer.start_as_current_span(
            f"store {topic}", context=parent, kind=SpanKind.SERVER, attributes=attributes,
            links=links,
        ) as span:  # fmt: skip
            response = await handler(self, request, context)
            status = response.block_status if request.blocks else None
            if status is None and len(response.results):
                status = response.results[0].status
            if status is not None:
                span.set_attribute("messaging.rocketmq.send_status", _status_name(status))
            return response

    return send  # type: ignore[return-value]


def _status_name(status: int) -> str:
    try:
        return str(broker_pb2.SendStatus.Name(status))
    except ValueError:
        return str(status)


def delivered(
    tracer: Tracer,
    operation: str,
    topic: str,
    group: str,
    chunks: Iterable[bytes],
    count: int | None = None,
    queue_id: int | None = None,
) -> None:
    """A ``deliver <topic>`` span for messages handed to a consumer (``operation``: pull or
    receive), continuing their producers' traces."""
    parent, links = _parent_and_links(contexts_in(chunks))
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "deliver",
        "messaging.rocketmq.delivery": operation,
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": group,
    }
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    if queue_id is not None and queue_id >= 0:
        attributes["messaging.destination.partition.id"] = str(queue_id)
    tracer.start_span(
        f"deliver {topic}", context=parent, kind=SpanKind.SERVER, attributes=attributes,
        links=links,
    ).end()  # fmt: skip


__all__ = [
    "MAX_LINKS",
    "TRACER",
    "TRACE_CONTEXT",
    "contexts_in",
    "delivered",
    "setup",
    "traced_store",
]
