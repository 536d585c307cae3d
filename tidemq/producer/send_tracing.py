"""The producer's spans (``tidemq.tracing``): one ``send <topic>`` span (kind PRODUCER) per
message, from the call until its answer, whose context the message carries in its
``TRACE_CONTEXT`` property: injected before the message is encoded (into its record block, or
its request), so the broker's and the consumers' spans continue this trace.

Made only when the producer has a tracer (an SDK is configured): otherwise the producer uses
the plain ``BlockCollector`` and never calls in here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from tidemq.producer.blocks import BlockCollector, BlockFuture
from tidemq.producer.pending import Pending
from tidemq.tracing import SYSTEM, TRACE_CONTEXT, traceparent


class SendTracing:
    def __init__(self, tracer: Tracer, group: str) -> None:
        self.tracer = tracer
        self.group = group

    def start(
        self,
        topic: str,
        properties: Mapping[str, str] | None,
        tag: str | None,
        keys: Sequence[str] | str,
        body_size: int,
        kind: str,
    ) -> tuple[dict[str, str], Span]:
        """A started send span, and ``properties`` with its context (a copy: the caller's
        mapping may be sent again, or shared)."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            "messaging.rocketmq.client_group": self.group,
            "messaging.rocketmq.message.type": kind,
            "messaging.message.body.size": body_size,
        }
        if tag:
            attributes["messaging.rocketmq.message.tag"] = tag
        if keys:
            attributes["messaging.rocketmq.message.keys"] = (
                [keys] if isinstance(keys, str) else list(keys)
            )
        span = self.tracer.start_span(
            f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        carried = dict(properties) if properties else {}
        carried[TRACE_CONTEXT] = traceparent(span.get_span_context())
        return carried, span

    def trace_pending(self, p: Pending) -> None:
        """A message of the per-message path: its span ends with its future."""
        if p.sharding_key is not None:
            kind = "fifo"
        elif p.delivery is not None:
            kind = "delay"
        else:
            kind = "normal"
        p.properties, span = self.start(p.topic, p.properties, p.tag, p.keys, len(p.body), kind)
        p.future.add_done_callback(functools.partial(_answered, span))


def _answered(span: Span, future: Any) -> None:
    """A send's answer, on whatever thread answered it."""
    try:
        error = future.exception()
    except asyncio.CancelledError as e:
        error = e
    if error is None:
        result = future.result()
        span.set_attribute("messaging.message.id", result.msg_id)
        span.set_attribute("messaging.destination.partition.id", str(result.queue_id))
        span.set_attribute("messaging.rocketmq.send_status", result.status.name)
    else:
        span.record_exception(error)
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


class TracedBlockCollector(BlockCollector):
    """``BlockCollector`` whose messages each get a send span. A subclass, chosen when the
    producer starts, so an untraced producer's per-message path has no tracing branch."""

    def __init__(self, send_tracing: SendTracing, *args: Any) -> None:
        super().__init__(*args)
        self.send_tracing = send_tracing

    def add(
        self,
        topic: str,
        body: object,
        tag: str | None,
        keys: Sequence[str] | str,
        properties: Mapping[str, str] | None,
    ) -> BlockFuture:
        size = len(body) if isinstance(body, bytes | bytearray | memoryview | str) else 0
        carried, span = self.send_tracing.start(topic, properties, tag, keys, size, "normal")
        try:
            future = super().add(topic, body, tag, keys, carried)
        except BaseException as e:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, str(e)))
            span.end()
            raise
        future.add_done_callback(functools.partial(_answered, span))
        return future


def send_tracing(tracer: Tracer | None, group: str) -> SendTracing | None:
    return SendTracing(tracer, group) if tracer is not None else None


__all__ = ["SendTracing", "TracedBlockCollector", "send_tracing"]
