"""What a receive reads from the store: new messages of a queue as the state machine's
candidates (tag match and message group worked out here), retried messages by offset, and where
a group starts on a queue it never received from."""

from __future__ import annotations

from collections.abc import Sequence

from tidemq.services.broker.receive.events import message_group_hash
from tidemq.services.broker.receive.queue_state import Candidate
from tidemq.services.errors import invalid
from tidemq.storage import MessageStore, StoredMessage
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

# RocketMQ 5's message group property (the SDK's message_group / sharding key).
PROP_MESSAGE_GROUP = "__SHARDINGKEY"


class QueueCandidates:
    """One queue's new messages for ``QueueInFlight.plan_receive`` (``NewMessages``)."""

    def __init__(
        self,
        store: MessageStore,
        topic: str,
        queue_id: int,
        tags: Sequence[str] | None,
        max_bytes: int,
        max_commitlog_offset: int | None,
    ) -> None:
        self.store = store
        self.topic = topic
        self.queue_id = queue_id
        self.tags = None if not tags else frozenset(tags)
        self.max_bytes = max_bytes
        self.max_commitlog_offset = max_commitlog_offset

    def read(self, from_offset: int, max_count: int) -> list[Candidate]:
        """Read without the store's tag filter: the state machine needs every offset, matching
        or not, to move its cursor over them. ``max_bytes`` is what is left for the answer: [],
        as at the end of the queue, once it is spent."""
        if self.max_bytes <= 0:
            return []
        try:
            got = self.store.get_messages(
                self.topic,
                self.queue_id,
                from_offset,
                max_count,
                self.max_bytes,
                None,
                max_commitlog_offset=self.max_commitlog_offset,
            )
        except (OffsetBelowMinError, OffsetBeyondMaxError):
            return []
        self.max_bytes -= sum(m.size for m in got.messages)
        tags = self.tags
        return [
            Candidate(
                m.queue_offset,
                tags is None or m.tags in tags,
                message_group_hash(m.properties.get(PROP_MESSAGE_GROUP)),
                m,
            )
            for m in got.messages
        ]


def read_one(store: MessageStore, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
    """The message at ``offset`` of the queue; None when retention deleted it."""
    try:
        got = store.get_messages(topic, queue_id, offset, 1, 1 << 30)
    except (OffsetBelowMinError, OffsetBeyondMaxError):
        return None
    if not got.messages or got.messages[0].queue_offset != offset:
        return None
    return got.messages[0]


def _is_timestamp(text: str) -> bool:
    # ASCII digits only: str.isdigit also takes superscripts that int() refuses.
    return text.isascii() and text.isdigit() and len(text) <= 18


def check_start_from(start_from: str) -> None:
    if start_from not in ("", "first", "last") and not _is_timestamp(start_from):
        raise invalid(
            f"start_from {start_from!r} must be 'first', 'last' or a timestamp in ms (digits)"
        )


def start_offset(
    store: MessageStore, topic: str, queue_id: int, start_from: str, committed: int | None
) -> int:
    """Where a group starts on a queue it never received from: its committed offset if it has
    one (a group that moved from offsets to receive/ack goes on from there), else what
    ``start_from`` says ("last" by default)."""
    lo, hi = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
    if committed is not None:
        return min(max(committed, lo), hi)
    if start_from == "first":
        return lo
    if _is_timestamp(start_from):
        return store.offset_by_time(topic, queue_id, int(start_from))
    return hi
