"""The dead-letter copy of a message, and which topics are the broker's own. Pure: no I/O.

A receive group's message that used up its delivery attempts (or that a consumer dead-lettered)
is copied to ``%DLQ%<group>`` (RocketMQ's name), queue 0, and marked done in its own queue. The
copy is the message as its consumers knew it: same body, tags, keys and properties (``UNIQ_KEY``
and the message group included), born time and host, ``reconsume_times`` = the attempts it had;
plus where it came from, under RocketMQ's property names where RocketMQ has one:

| property | value |
| --- | --- |
| ``RETRY_TOPIC`` | the original topic (RocketMQ's name: resend sends it back there) |
| ``ORIGIN_MESSAGE_ID`` | the original message id (the first one, for a message resent from a DLQ) |
| ``DLQ_ORIGIN_QUEUE_ID``, ``DLQ_ORIGIN_QUEUE_OFFSET`` | its queue and offset there |
| ``DLQ_DELIVERY_ATTEMPTS`` | how many times it was delivered |
| ``DLQ_REASON`` | ``max delivery attempts (16)``, or the reason a consumer gave |
| ``DLQ_TIME_MS`` | when it was dead-lettered (server clock) |

Topics starting ``%SYS%`` are the broker's own logs (``%SYS%RECEIVE_LOG``): never in the routes,
never listed, never written by clients. Clients may read ``%DLQ%`` topics, but only the broker
writes them.
"""

from __future__ import annotations

from typing import Final

from tidemq.storage import Message, StoredMessage
from tidemq.storage.errors import InvalidTopicError
from tidemq.storage.record import (
    NAME_SEP,
    PROP_KEYS,
    PROP_SEP,
    PROP_TAGS,
    PROPERTIES_MAX_BYTES,
    RECORD_CRC_SIZE,
    TOPIC_MAX_BYTES,
    validate_topic,
)

DLQ_PREFIX: Final = "%DLQ%"
SYSTEM_PREFIX: Final = "%SYS%"

PROP_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROP_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROP_ORIGIN_QUEUE_ID: Final = "DLQ_ORIGIN_QUEUE_ID"
PROP_ORIGIN_QUEUE_OFFSET: Final = "DLQ_ORIGIN_QUEUE_OFFSET"
PROP_DELIVERY_ATTEMPTS: Final = "DLQ_DELIVERY_ATTEMPTS"
PROP_REASON: Final = "DLQ_REASON"
PROP_TIME_MS: Final = "DLQ_TIME_MS"
# Set only when the original's properties left no room for ours (see ``_fit``).
PROP_DROPPED: Final = "DLQ_DROPPED_PROPERTIES"

REASON_MAX_CHARS: Final = 256
# Properties a copy always keeps, whatever room they take: what a resend needs, and the
# message's identity.
_ESSENTIAL: Final = frozenset(
    {
        PROP_RETRY_TOPIC,
        PROP_ORIGIN_MESSAGE_ID,
        PROP_ORIGIN_QUEUE_ID,
        PROP_ORIGIN_QUEUE_OFFSET,
        PROP_DELIVERY_ATTEMPTS,
        "UNIQ_KEY",
    }
)
# The record CRC property takes its share of the limit (the store writes it on every record).
_PROPERTIES_BUDGET: Final = PROPERTIES_MAX_BYTES - RECORD_CRC_SIZE


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``."""
    return DLQ_PREFIX + group


def dlq_topic_problem(group: str) -> str | None:
    """Why ``group`` can have no dead-letter topic (a name a topic cannot carry), or None."""
    try:
        validate_topic(dlq_topic(group))
    except InvalidTopicError as e:
        return (
            f"consumer group {group!r} cannot have a dead-letter topic {dlq_topic(group)!r}: {e}"
            f" (a receive group's name is at most {TOPIC_MAX_BYTES - len(DLQ_PREFIX)} letters,"
            f" digits, '%', '|', '_' or '-')"
        )
    return None


def is_system_topic(topic: str) -> bool:
    """The broker's own log topics (``%SYS%...``): out of routes and topic lists."""
    return topic.startswith(SYSTEM_PREFIX)


def is_dead_letter_topic(topic: str) -> bool:
    return topic.startswith(DLQ_PREFIX)


def client_may_send(topic: str) -> bool:
    """Whether a client's send may name ``topic``: not a system topic nor a dead-letter queue
    (only the broker writes those; a resend goes to the original topic)."""
    return not (topic.startswith(SYSTEM_PREFIX) or topic.startswith(DLQ_PREFIX))


def max_attempts_reason(max_delivery_attempts: int) -> str:
    return f"max delivery attempts ({max_delivery_attempts})"


def dead_letter_copy(
    stored: StoredMessage, *, group: str, attempts: int, reason: str, now_ms: int
) -> Message:
    """The copy of ``stored`` to put in ``group``'s dead-letter queue (queue 0).

    ``attempts`` is how many times it was delivered; ``reason`` is free text (a consumer's), cut
    to ``REASON_MAX_CHARS`` and cleaned of the property separators, so the copy is always one
    the store accepts."""
    props = {k: v for k, v in stored.properties.items() if k not in (PROP_TAGS, PROP_KEYS)}
    props.update(
        {
            PROP_RETRY_TOPIC: stored.topic,
            # A message sent back from a dead-letter queue keeps its first id (RocketMQ keeps
            # an ORIGIN_MESSAGE_ID it finds): the chain leads to the message first sent.
            PROP_ORIGIN_MESSAGE_ID: stored.properties.get(PROP_ORIGIN_MESSAGE_ID) or stored.msg_id,
            PROP_ORIGIN_QUEUE_ID: str(stored.queue_id),
            PROP_ORIGIN_QUEUE_OFFSET: str(stored.queue_offset),
            PROP_DELIVERY_ATTEMPTS: str(attempts),
            PROP_REASON: _clean(reason)[:REASON_MAX_CHARS],
            PROP_TIME_MS: str(now_ms),
        }
    )
    if not props[PROP_REASON]:
        del props[PROP_REASON]
    tags = stored.tags
    keys = tuple(stored.keys)
    return Message(
        topic=dlq_topic(group),
        body=stored.body,
        queue_id=0,
        tags=tags,
        keys=keys,
        properties=_fit(props, tags, keys),
        flag=stored.flag,
        born_timestamp_ms=stored.born_timestamp_ms,
        born_host=stored.born_host,
        reconsume_times=attempts,
    )


def _clean(text: str) -> str:
    # \x01 and \x02 separate property names and values in a record.
    return text.replace("\x01", " ").replace("\x02", " ")


def _size(props: dict[str, str], tags: str | None, keys: tuple[str, ...]) -> int:
    """The encoded size of the record's properties (``encode_properties`` refuses past the
    limit, so it cannot measure)."""
    full = dict(props)
    if tags:
        full[PROP_TAGS] = tags
    if keys:
        full[PROP_KEYS] = " ".join(keys)
    return sum(len(f"{k}{NAME_SEP}{v}{PROP_SEP}".encode()) for k, v in full.items())


def _fit(props: dict[str, str], tags: str | None, keys: tuple[str, ...]) -> dict[str, str]:
    """``props`` within the store's limit. The original's were within it, ours add a few hundred
    bytes: only a message whose properties nearly filled the limit needs this. Then the reason
    and time go first, then the largest of the user's properties (named in
    ``DLQ_DROPPED_PROPERTIES``): a dead-lettering that failed on size would be retried forever,
    and the copy's origin matters more than any one property."""
    limit = _PROPERTIES_BUDGET
    if _size(props, tags, keys) <= limit:
        return props
    for optional in (PROP_REASON, PROP_TIME_MS):
        props.pop(optional, None)
    dropped: list[str] = []
    by_size = sorted(
        (k for k in props if k not in _ESSENTIAL), key=lambda k: len(k) + len(props[k])
    )
    while by_size and _size({**props, PROP_DROPPED: " ".join(dropped)}, tags, keys) > limit:
        name = by_size.pop()
        del props[name]
        dropped.append(name)
    if dropped:
        props[PROP_DROPPED] = " ".join(dropped)[:REASON_MAX_CHARS]
    return props
