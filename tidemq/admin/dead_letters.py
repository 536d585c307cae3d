"""Dead-letter queues in the admin client: a receive group's messages that used up their
delivery attempts (or that a consumer dead-lettered) are copied to ``%DLQ%<group>``, one queue
per broker group, keeping their original topic (``RETRY_TOPIC``), message id
(``ORIGIN_MESSAGE_ID``), keys, tags and properties. ``AsyncDeadLetters`` lists them and sends
one back to its topic; it is mixed into ``AsyncAdmin``, ``DeadLetters`` into ``Admin``."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq._runtime import LoopThread
from tidemq.errors import InvalidArgumentError, MessageNotFoundError, RouteNotFoundError
from tidemq.producer import AsyncProducer
from tidemq.protos import broker_pb2
from tidemq.routes import NameServerClient
from tidemq.types import MESSAGE_GROUP_PROPERTY, ReceivedMessage, SendResult

T = TypeVar("T")

DLQ_PREFIX = "%DLQ%"
# Properties the broker adds to a dead-letter copy; a resent message goes without them.
DLQ_PROPERTIES = frozenset(
    {
        "RETRY_TOPIC",
        "DLQ_ORIGIN_QUEUE_ID",
        "DLQ_ORIGIN_QUEUE_OFFSET",
        "DLQ_DELIVERY_ATTEMPTS",
        "DLQ_REASON",
        "DLQ_TIME_MS",
    }
)
PULL_BATCH = 256


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class AsyncDeadLetters:
    """Mixed into ``AsyncAdmin``, which provides ``_call`` and ``nameserver``."""

    if TYPE_CHECKING:
        nameserver: NameServerClient

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

    async def dead_letters(self, group: str, *, limit: int = 100) -> list[ReceivedMessage]:
        """Up to ``limit`` messages of the group's dead-letter queue, oldest first per queue.
        Each keeps its original message's body, tag, keys and properties, plus
        ``RETRY_TOPIC`` (its topic), ``ORIGIN_MESSAGE_ID``, ``DLQ_DELIVERY_ATTEMPTS``,
        ``DLQ_REASON``, ...; ``reconsume_times`` is its delivery attempts."""
        if limit <= 0:
            raise InvalidArgumentError("limit must be > 0", code="INVALID_ARGUMENT")
        topic = dlq_topic(group)
        try:
            route = await self.nameserver.query_route(topic)
        except RouteNotFoundError:
            return []  # nothing was ever dead-lettered
        out: list[ReceivedMessage] = []
        for mq in route.read_queues:
            address = route.groups[mq.broker_name].read_address()
            if address is None:
                continue
            offsets = await self._call(
                address,
                "GetQueueOffsets",
                broker_pb2.GetQueueOffsetsRequest(topic=topic, queue_ids=[mq.queue_id]),
            )
            offset, end = offsets.queues[0].min_offset, offsets.queues[0].max_offset
            while offset < end and len(out) < limit:
                resp = await self._call(
                    address,
                    "PullMessage",
                    broker_pb2.PullMessageRequest(
                        topic=topic,
                        queue_id=mq.queue_id,
                        offset=offset,
                        max_messages=min(PULL_BATCH, limit - len(out)),
                        max_bytes=4 << 20,
                        tag_expression="*",
                    ),
                )
                out += [ReceivedMessage.from_proto(m, mq.broker_name) for m in resp.messages]
                if resp.next_offset <= offset:
                    break
                offset = resp.next_offset
            if len(out) >= limit:
                break
        return out[:limit]

    async def resend_dead_letter(self, group: str, msg_id: str) -> SendResult:
        """Sends a dead-lettered message back to its original topic, as a new message with the
        same body, tag, keys, message group and user properties (``ORIGIN_MESSAGE_ID`` kept).
        The copy stays in the dead-letter queue."""
        message = await self._dead_letter_by_id(group, msg_id)
        props = dict(message.properties)
        original = props.get("RETRY_TOPIC")
        if not original:
            raise InvalidArgumentError(
                f"message {msg_id} has no RETRY_TOPIC property: not a dead-letter copy",
                code="INVALID_ARGUMENT",
            )
        message_group = props.pop(MESSAGE_GROUP_PROPERTY, None)
        for name in DLQ_PROPERTIES:
            props.pop(name, None)
        async with AsyncProducer(list(self.nameserver.addresses)) as producer:
            return await producer.send(
                original,
                message.body,
                tag=message.tag,
                keys=message.keys,
                properties=props or None,
                message_group=message_group,
            )

    async def _dead_letter_by_id(self, group: str, msg_id: str) -> ReceivedMessage:
        topic = dlq_topic(group)
        try:
            route = await self.nameserver.query_route(topic)
        except RouteNotFoundError:
            raise MessageNotFoundError(
                f"group {group!r} has no dead-letter queue", code="MESSAGE_NOT_FOUND"
            ) from None
        for name in sorted(route.groups):
            address = route.groups[name].read_address()
            if address is None:
                continue
            try:
                resp = await self._call(
                    address, "ViewMessage", broker_pb2.ViewMessageRequest(msg_id=msg_id)
                )
            except (MessageNotFoundError, InvalidArgumentError):
                continue
            if resp.message.topic == topic:
                return ReceivedMessage.from_proto(resp.message, name)
        raise MessageNotFoundError(f"message {msg_id} is not in {topic}", code="MESSAGE_NOT_FOUND")


class DeadLetters:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncDeadLetters
        _runner: LoopThread

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def dead_letters(self, group: str, *, limit: int = 100) -> list[ReceivedMessage]:
        return self._run(self._core.dead_letters(group, limit=limit))

    def resend_dead_letter(self, group: str, msg_id: str) -> SendResult:
        return self._run(self._core.resend_dead_letter(group, msg_id))
