"""Committed offsets of deleted topics are dropped once the topic has been gone a while
(RocketMQ's broker scans for them too): without this, every topic ever deleted keeps its
groups' offsets in consumerOffset.json, in every config sync and in every offset table.

The wait (``deleted_topic_offsets_grace_ms``, an hour by default) covers a topic deleted and
created again (its groups carry on where they were) and a slave whose topic table is a sync
behind. Topics whose names start with ``%`` (retry, dead-letter and system topics) may be used
without a topic config of their own and are never touched. Both sides of a broker group scan:
a slave that handed the offsets back before its own scan dropped them is harmless, the
master's next scan drops them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidemq.services.broker.offsets import OffsetManager

log = logging.getLogger(__name__)


class DeletedTopicOffsets:
    def __init__(
        self, offsets: OffsetManager, topic_names: Callable[[], set[str]], grace_ms: int
    ) -> None:
        self.offsets = offsets
        self.topic_names = topic_names
        self.grace_ms = grace_ms
        # topic -> when this broker first saw offsets of it without the topic (its clock, ms).
        self.gone_since: dict[str, int] = {}

    def scan(self, now_ms: int) -> list[str]:
        """Drop the offsets of topics gone for the grace period; returns those topics."""
        live = self.topic_names()
        orphans = {
            e.topic
            for e in self.offsets.entries()
            if e.topic not in live and not e.topic.startswith("%")
        }
        self.gone_since = {t: self.gone_since.get(t, now_ms) for t in orphans}
        expired = sorted(
            t for t, since in self.gone_since.items() if now_ms - since >= self.grace_ms
        )
        if expired:
            n = self.offsets.drop_topics(expired)
            for t in expired:
                del self.gone_since[t]
            log.info("dropped %d committed offsets of deleted topics %s", n, expired)
        return expired
