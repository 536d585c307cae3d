"""The consumers' spans (``tidemq.tracing``), made only when a consumer has a tracer:

- ``receive <topic>`` (kind CONSUMER), one per message handed to the application by ``poll``
  or ``receive``: a child of the context the message carries, so it continues the producer's
  trace; it ends at once (what the application does next is its own span: ``processing``).
- ``process <topic>`` (kind CONSUMER), around a push consumer's listener, current while it
  runs (the listener's own spans nest in it), also a child of the message's context.
- ``ack <topic>`` (kind CLIENT), around an ack call: a child of the span current at the call,
  else of the one message's context; linked to the messages' contexts (at most ``MAX_LINKS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from tidemq.tracing import SYSTEM, context_of, links_to, span_context_of, tracer_of
from tidemq.types import ReceivedMessage

T = TypeVar("T")


class ConsumeTracing:
    def __init__(self, tracer: Tracer, group: str) -> None:
        self.tracer = tracer
        self.group = group

    def _attributes(self, m: ReceivedMessage, operation: str, kind: str) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": kind,
            "messaging.destination.name": m.topic,
            "messaging.consumer.group.name": self.group,
            "messaging.rocketmq.client_group": self.group,
            "messaging.message.id": m.msg_id,
            "messaging.destination.partition.id": str(m.queue_id),
            "messaging.rocketmq.message.offset": m.queue_offset,
            "messaging.message.body.size": len(m.body),
        }
        if m.tag:
            attributes["messaging.rocketmq.message.tag"] = m.tag
        if m.keys:
            attributes["messaging.rocketmq.message.keys"] = list(m.keys)
        if m.delivery_attempt:
            attributes["messaging.rocketmq.message.delivery_attempt"] = m.delivery_attempt
        return attributes

    def received(self, messages: Sequence[ReceivedMessage]) -> None:
        tracer = self.tracer
        for m in messages:
            span = tracer.start_span(
                f"receive {m.topic}",
                context=context_of(m.properties),
                kind=SpanKind.CONSUMER,
                attributes=self._attributes(m, "receive", "receive"),
            )
            span.end()

    @contextlib.contextmanager
    def processing(self, message: ReceivedMessage) -> Iterator[Span]:
        with self.tracer.start_as_current_span(
            f"process {message.topic}",
            context=context_of(message.properties),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes(message, "process", "process"),
        ) as span:
            yield span

    def wrap_listener(self, listener: Callable[[ReceivedMessage], T]) -> Callable[..., T]:
        """``listener`` run inside a process span (for a blocking listener, on its thread;
        an async one's span covers the coroutine's creation only, so ``AsyncPushConsumer``
        awaits inside ``processing`` instead)."""

        def traced(message: ReceivedMessage) -> T:
            with self.processing(message):
                return listener(message)

        return traced

    @contextlib.contextmanager
    def acking(self, messages: Sequence[ReceivedMessage], operation: str = "ack") -> Iterator[Span]:
        current = trace.get_current_span().get_span_context()
        contexts = [span_context_of(m.properties) for m in messages[:256]]
        parent = None
        if not current.is_valid and len(messages) == 1:
            parent = context_of(messages[0].properties)
        topics = sorted({m.topic for m in messages})
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": "settle",
            "messaging.destination.name": topics[0] if len(topics) == 1 else ",".join(topics),
            "messaging.consumer.group.name": self.group,
            "messaging.rocketmq.client_group": self.group,
            "messaging.batch.message_count": len(messages),
        }
        if len(messages) == 1:
            attributes["messaging.message.id"] = messages[0].msg_id
        with self.tracer.start_as_current_span(
            f"{operation} {attributes['messaging.destination.name']}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links_to(contexts),
        ) as span:
            yield span

    def settled(self, span: Span, errors: Sequence[BaseException | None]) -> None:
        failed = [e for e in errors if e is not None]
        if failed:
            span.set_attribute("error.type", type(failed[0]).__name__)
            span.set_status(Status(StatusCode.ERROR, f"{len(failed)} failed: {failed[0]}"))


def consume_tracing(provider: Any, group: str) -> ConsumeTracing | None:
    tracer = tracer_of(provider)
    return ConsumeTracing(tracer, group) if tracer is not None else None


__all__ = ["ConsumeTracing", "consume_tracing"]
