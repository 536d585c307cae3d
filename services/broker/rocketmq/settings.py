"""Telemetry settings: what a client announced, merged with what the broker imposes (the Apache
proxy's answer). Never an empty ``Settings``: a producer adopts ``max_body_size`` from it, and a
zero there fails every send. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.protos.rocketmq import definition_pb2
from tidemq.services.broker.groups import GroupSettings
from tidemq.services.broker.rocketmq.status import StatusError

C = definition_pb2

# Producers retry a failed send on the next queue: 3 attempts, 10 ms doubling to 1 s.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1_000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
# Consumers: at most this many messages per receive, long polls of at most this long.
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000


@dataclass(frozen=True)
class BrokerLimits:
    """What the broker imposes on every client's settings."""

    max_body_bytes: int


def merge(
    client: definition_pb2.Settings,
    limits: BrokerLimits,
    group: GroupSettings | None,
) -> definition_pb2.Settings:
    """The settings to answer: the client's own, with the broker's values over them.

    ``group`` is the consumer group's settings (the defaults for a group not yet created).
    StatusError(BAD_REQUEST) for settings with neither publishing nor subscription."""
    kind = client.WhichOneof("pub_sub")
    if kind is None:
        raise StatusError(
            C.BAD_REQUEST, "settings name neither publishing (a producer) nor subscription"
        )
    out = definition_pb2.Settings()
    out.CopyFrom(client)
    out.metric.Clear()
    out.metric.on = False  # on=true would start an OTLP exporter towards an address we lack
    if kind == "publishing":
        out.publishing.max_body_size = limits.max_body_bytes
        out.publishing.validate_message_type = True
        policy = out.backoff_policy
        policy.Clear()
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        backoff = policy.exponential_backoff
        backoff.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
        backoff.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
        backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        return out
    settings = group or GroupSettings()
    sub = out.subscription
    sub.receive_batch_size = RECEIVE_BATCH_SIZE
    sub.long_polling_timeout.FromMilliseconds(LONG_POLLING_TIMEOUT_MS)
    sub.fifo = settings.fifo
    policy = out.backoff_policy
    policy.Clear()
    policy.max_attempts = settings.max_delivery_attempts
    retry = settings.retry_policy
    if retry.delays_ms:
        for delay_ms in retry.delays_ms:
            policy.customized_backoff.next.add().FromMilliseconds(delay_ms)
    else:
        backoff = policy.exponential_backoff
        backoff.initial.FromMilliseconds(retry.initial_ms)
        backoff.max.FromMilliseconds(retry.max_ms)
        backoff.multiplier = retry.multiplier
    return out


def consumer_group(settings: definition_pb2.Settings) -> str:
    """The group a consumer's settings name ("" for a producer or none)."""
    if settings.WhichOneof("pub_sub") != "subscription":
        return ""
    return str(settings.subscription.group.name)


def published_topics(settings: definition_pb2.Settings) -> list[str]:
    if settings.WhichOneof("pub_sub") != "publishing":
        return []
    return [t.name for t in settings.publishing.topics]
