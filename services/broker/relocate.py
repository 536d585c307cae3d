"""One message stored again in another place: a half record and the message a commit stores, a
fired timer's message. What the producer sent (body, tags, keys, flag, birth) stays; topic,
queue and properties are the new place's. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from tidemq.storage import Message, StoredMessage


def relocated(
    m: Message | StoredMessage, topic: str, queue_id: int, properties: Mapping[str, str]
) -> Message:
    return Message(
        topic=topic,
        body=m.body,
        queue_id=queue_id,
        tags=m.tags,
        keys=tuple(m.keys),
        properties=properties,
        flag=m.flag,
        born_timestamp_ms=m.born_timestamp_ms,
        born_host=m.born_host,
    )
