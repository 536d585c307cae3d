"""Pending delayed messages in the admin client (docs/production.md): list them across the
cluster's masters, soonest first, and recall (cancel) one by the handle its send returned.
``AsyncDelayed`` is mixed into ``AsyncAdmin``, ``Delayed`` into ``Admin``.

A delayed message waits on the master of the broker group that stored it, so both calls go to
masters (a recall to the one its handle names); a group without a master now (a failover under
way) is an error, not an empty answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tidemq._runtime import LoopThread
from tidemq.admin.masters import AcrossMasters, check_limit
from tidemq.errors import BrokerUnavailableError, InvalidArgumentError
from tidemq.producer.recall import broker_of
from tidemq.protos import broker_pb2


@dataclass(frozen=True)
class DelayedMessage:
    """One pending delayed message: where and when it will be delivered, and its handle."""

    broker: str  # the broker group holding it
    topic: str
    queue_id: int
    msg_id: str
    deliver_at_ms: int
    recall_handle: str
    tag: str | None
    keys: tuple[str, ...]
    stored_at_ms: int

    @classmethod
    def from_proto(cls, m: Any, broker: str) -> DelayedMessage:
        return cls(
            broker=broker,
            topic=m.topic,
            queue_id=m.queue_id,
            msg_id=m.msg_id,
            deliver_at_ms=m.deliver_at_ms,
            recall_handle=m.recall_handle,
            tag=m.tag or None,
            keys=tuple(m.keys),
            stored_at_ms=m.stored_at_ms,
        )

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["keys"] = list(self.keys)
        return out


@dataclass(frozen=True)
class DelayedMessages:
    """At most ``limit`` pending messages, soonest first, and how many are pending in all."""

    messages: list[DelayedMessage]
    total: int


class AsyncDelayed(AcrossMasters):
    """Mixed into ``AsyncAdmin``, which provides ``_call`` and ``masters``."""

    async def list_delayed(self, topic: str | None = None, *, limit: int = 100) -> DelayedMessages:
        """Pending delayed messages of ``topic`` (default: every topic) on every master, soonest
        first; ``total`` counts them all, ``messages`` holds at most ``limit``."""
        check_limit(limit)
        request = broker_pb2.ListDelayedMessagesRequest(topic=topic or "", limit=limit)
        found, total = await self._list_on_masters(
            "ListDelayedMessages",
            request,
            lambda resp, name: [DelayedMessage.from_proto(m, name) for m in resp.messages],
            lambda m: (m.deliver_at_ms, m.broker, m.msg_id),
            limit,
        )
        return DelayedMessages(found, total)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancels a pending delayed message of ``topic`` by the handle its send returned (RocketMQ
        5's recall); returns its message id. ``DelayedMessageNotFound`` once it was delivered or
        recalled already; ``InvalidArgumentError`` for a damaged handle or another topic's;
        ``BrokerUnavailableError`` (retriable) while the handle's broker group has no master."""
        if not topic:
            raise InvalidArgumentError("recall needs a topic", code="INVALID_ARGUMENT")
        # The handle names the broker group holding the message: ask that group's master.
        broker = broker_of(recall_handle)
        address = (await self.masters()).get(broker)
        if address is None:
            raise BrokerUnavailableError(
                f"broker group {broker!r} of the recall handle has no master now",
                code="NOT_MASTER",
            )
        resp = await self._call(
            address,
            "RecallMessage",
            broker_pb2.RecallMessageRequest(topic=topic, recall_handle=recall_handle),
        )
        return str(resp.msg_id)


class Delayed:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncDelayed
        _runner: LoopThread

    def list_delayed(self, topic: str | None = None, *, limit: int = 100) -> DelayedMessages:
        return self._runner.run(self._core.list_delayed(topic, limit=limit))

    def recall(self, topic: str, recall_handle: str) -> str:
        return self._runner.run(self._core.recall(topic, recall_handle))
