"""OpenTelemetry tracing of the clients (docs/sdk.md, "Tracing"): what the producer and the
consumers share, and what an application uses to continue a message's trace.

A message carries its trace context as RocketMQ does: the W3C ``traceparent`` of the span that
sent it (``00-<trace id>-<span id>-<flags>``) in the ``TRACE_CONTEXT`` property. RocketMQ's proxy
stores a RocketMQ 5 client's ``SystemProperties.trace_context`` under that name and hands it back
in the same field (the OpenTelemetry instrumentation of the Java client fills and reads it), so
a trace crosses between these clients and the official ones both ways. RocketMQ 4's
instrumentation puts ``traceparent`` (and ``tracestate``) among the user properties instead:
those are read too.

Tracing is off unless an OpenTelemetry SDK is configured: a client decides once, when it is
made, from its ``tracer_provider`` setting or the global provider. Off, the API's proxy provider
is in place and a client holds no tracer: no span, no property, not a branch per message beyond
one ``is None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# RocketMQ's MessageConst.PROPERTY_TRACE_CONTEXT: a W3C traceparent.
TRACE_CONTEXT = "TRACE_CONTEXT"
# Where RocketMQ 4's instrumentation (and W3C-minded applications) put it: user properties.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# A span of many messages (a batch stored, a pull answered, acks) links to at most this many
# of their contexts: enough to find the traces, bounded in what a span costs and weighs.
MAX_LINKS = 32

SYSTEM = "rocketmq"  # messaging.system: the protocol family, as RocketMQ's own clients say

_PROPAGATOR = TraceContextTextMapPropagator()


def _version() -> str:
    try:
        return metadata.version("tidemq")
    except metadata.PackageNotFoundError:
        return "0"


def tracer_of(provider: TracerProvider | None, name: str = "tidemq") -> Tracer | None:
    """A tracer when an SDK is configured (``provider``, else the global one), else None.

    The API without an SDK answers with a proxy (or no-op) provider whose spans are dropped:
    then there is nothing to trace, and the caller skips all the work."""
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    tracer = provider.get_tracer(name, _version())
    # An SDK disabled by OTEL_SDK_DISABLED hands out no-op tracers.
    if isinstance(tracer, trace.NoOpTracer):
        return None
    return tracer


def traceparent(span_context: SpanContext) -> str:
    """The W3C traceparent of ``span_context`` (version 00)."""
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}"
        f"-{int(span_context.trace_flags):02x}"
    )


def context_of(properties: Mapping[str, str] | None) -> Context | None:
    """The trace context a message carries in its properties, None without a valid one."""
    if not properties:
        return None
    value = properties.get(TRACE_CONTEXT) or properties.get(TRACEPARENT)
    if not value:
        return None
    carrier = {TRACEPARENT: value}
    state = properties.get(TRACESTATE)
    if state:
        carrier[TRACESTATE] = state
    context = _PROPAGATOR.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_context_of(properties: Mapping[str, str] | None) -> SpanContext | None:
    context = context_of(properties)
    if context is None:
        return None
    return trace.get_current_span(context).get_span_context()


def message_context(message: Any) -> Context | None:
    """The trace context of a received message (``ReceivedMessage``): pass it as ``context=``
    to ``tracer.start_as_current_span`` to continue the producer's trace while handling it."""
    return context_of(getattr(message, "properties", None))


def links_to(contexts: Iterable[SpanContext | None]) -> list[Link]:
    """Links to the distinct valid contexts, at most ``MAX_LINKS``."""
    seen: set[tuple[int, int]] = set()
    links = []
    for c in contexts:
        if c is None or not c.is_valid:
            continue
        key = (c.trace_id, c.span_id)
        if key in seen:
            continue
        seen.add(key)
        links.append(Link(c))
        if len(links) >= MAX_LINKS:
            break
    return links


__all__ = [
    "MAX_LINKS",
    "SYSTEM",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_CONTEXT",
    "context_of",
    "links_to",
    "message_context",
    "span_context_of",
    "traceparent",
    "tracer_of",
]
