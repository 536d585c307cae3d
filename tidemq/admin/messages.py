"""Messages in the admin client: look one up by id, find a topic's messages by key or by time
range, and tell a message's life (docs/consumption.md, "A message's life"; assembled by
``tidemq.admin.message_history`` from what the broker group answers).

``AsyncMessages`` is mixed into ``AsyncAdmin``, ``Messages`` into ``Admin``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq._runtime import LoopThread
from tidemq.admin.message_history import (
    GroupOutcome,
    MessageEvent,
    MessageEventKind,
    MessageHistory,
    assemble_history,
)
from tidemq.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    RouteNotFoundError,
    TidemqError,
)
from tidemq.protos import broker_pb2
from tidemq.routes import NameServerClient, TopicRoute
from tidemq.types import ReceivedMessage

__all__ = [
    "AsyncMessages",
    "GroupOutcome",
    "MessageEvent",
    "MessageEventKind",
    "MessageHistory",
    "Messages",
    "assemble_history",
    "msg_id_address",
]

T = TypeVar("T")

MAX_FIND_LIMIT = 10_000
_PULL_BATCH = 256
_PULL_BYTES = 4 << 20
# The scan of a receive log can take a while on a broker with a long one.
HISTORY_TIMEOUT_S = 60.0


def msg_id_address(msg_id: str) -> str:
    """The store address an offset message id names (``ip:port``); InvalidArgumentError
    (INVALID_MESSAGE_ID) when it is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) not in (16, 28):
        raise InvalidArgumentError(
            f"{msg_id!r} is not a message id (32 or 56 hex characters)", code="INVALID_MESSAGE_ID"
        )
    addr = raw[: len(raw) - 12]
    port = int.from_bytes(raw[len(addr) : len(addr) + 4], "big")
    if len(addr) == 4:
        return ".".join(str(b) for b in addr) + f":{port}"
    hextets = [addr[i : i + 2].hex() for i in range(0, 16, 2)]
    return "[" + ":".join(hextets) + f"]:{port}"


# ---------------------------------------------------------------- the admin mixins


class AsyncMessages:
    """Mixed into ``AsyncAdmin``, which provides ``_call``, ``nameserver``, ``route`` and
    ``cluster_info``."""

    if TYPE_CHECKING:
        nameserver: NameServerClient

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

        async def cluster_info(self) -> Any: ...

        async def route(self, topic: str) -> TopicRoute: ...

    async def _broker_addresses(self) -> list[tuple[str, str]]:
        """(broker group, address) of every broker the nameservers know, masters first."""
        info = await self.cluster_info()
        found: list[tuple[int, str, str]] = []
        for c in info.clusters:
            for g in c.groups:
                for broker_id, address in g.addresses.items():
                    found.append((broker_id, g.broker_name, address))
        found.sort()
        return [(name, address) for _, name, address in found]

    async def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message of ``msg_id`` (an offset message id, as a send returns it): body,
        properties, where and when it was stored. Asks the broker the id names first, then
        every other broker (only the broker that stored a message answers for its id)."""
        host = msg_id_address(msg_id)
        brokers = await self._broker_addresses()
        brokers.sort(key=lambda b: b[1] != host)
        unreachable: TidemqError | None = None
        for name, address in brokers:
            try:
                resp = await self._call(
                    address, "ViewMessage", broker_pb2.ViewMessageRequest(msg_id=msg_id)
                )
            except MessageNotFoundError:
                continue
            except TidemqError as e:
                if not e.retriable:
                    raise
                unreachable = e
                continue
            return ReceivedMessage.from_proto(resp.message, name)
        if unreachable is not None:
            raise MessageNotFoundError(
                f"message {msg_id} was not found; some brokers did not answer ({unreachable})",
                code="MESSAGE_NOT_FOUND",
                retriable=True,
            )
        raise MessageNotFoundError(f"message {msg_id} was not found", code="MESSAGE_NOT_FOUND")

    async def find_messages(
        self,
        topic: str,
        *,
        key: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[ReceivedMessage]:
        """Messages of ``topic``: with ``key``, those carrying it (a key or the unique key;
        at most 64 per broker group, the index's bound), within ``[begin_ms, end_ms)`` when
        given; without, those stored in ``[begin_ms, end_ms)`` (defaults: the beginning, now).
        Merged over the topic's broker groups, oldest first by store time, at most ``limit``."""
        if not 1 <= limit <= MAX_FIND_LIMIT:
            raise InvalidArgumentError(
                f"limit must be 1..{MAX_FIND_LIMIT}, got {limit}", code="INVALID_ARGUMENT"
            )
        begin = begin_ms or 0
        end = end_ms if end_ms is not None else 2**63 - 1
        if begin < 0 or end <= begin:
            raise InvalidArgumentError(
                f"the time range [{begin_ms}, {end_ms}) is empty or negative",
                code="INVALID_ARGUMENT",
            )
        if key is not None and not key:
            raise InvalidArgumentError("key must not be empty", code="INVALID_ARGUMENT")
        route = await self.route(topic)
        if key is not None:
            found = await self._find_by_key(route, topic, key, begin, end, limit)
        else:
            found = await self._find_by_time(route, topic, begin, end, limit)
        found.sort(key=lambda m: (m.store_timestamp_ms, m.broker, m.queue_id, m.queue_offset))
        return found[:limit]

    async def _find_by_key(
        self, route: TopicRoute, topic: str, key: str, begin: int, end: int, limit: int
    ) -> list[ReceivedMessage]:
        request = broker_pb2.QueryMessageRequest(
            topic=topic,
            key=key,
            begin_timestamp_ms=begin,
            end_timestamp_ms=end,
            max_messages=limit,
        )

        async def one(name: str, address: str) -> list[ReceivedMessage]:
            resp = await self._call(address, "QueryMessage", request)
            return [
                ReceivedMessage.from_proto(m, name)
                for m in resp.messages
                if begin <= m.store_timestamp_ms < end
            ]

        calls = [
            one(name, address)
            for name, g in sorted(route.groups.items())
            if (address := g.read_address()) is not None
        ]
        return [m for found in await asyncio.gather(*calls) for m in found]

    async def _find_by_time(
        self, route: TopicRoute, topic: str, begin: int, end: int, limit: int
    ) -> list[ReceivedMessage]:
        out: list[ReceivedMessage] = []
        for mq in route.read_queues:
            address = route.groups[mq.broker_name].read_address()
            if address is not None:
                out += await self._queue_by_time(
                    address, mq.broker_name, topic, mq.queue_id, begin, end, limit
                )
        return out

    async def _queue_by_time(
        self,
        address: str,
        broker: str,
        topic: str,
        queue_id: int,
        begin: int,
        end: int,
        limit: int,
    ) -> list[ReceivedMessage]:
        """Up to ``limit`` messages of one queue stored in ``[begin, end)``, oldest first."""
        offsets = await self._call(
            address,
            "GetQueueOffsets",
            broker_pb2.GetQueueOffsetsRequest(topic=topic, queue_ids=[queue_id]),
        )
        stop = offsets.queues[0].max_offset
        start = offsets.queues[0].min_offset
        if begin > 0:
            resp = await self._call(
                address,
                "SearchOffset",
                broker_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=begin),
            )
            start = max(start, int(resp.offset))
        out: list[ReceivedMessage] = []
        offset = start
        while offset < stop and len(out) < limit:
            resp = await self._call(
                address,
                "PullMessage",
                broker_pb2.PullMessageRequest(
                    topic=topic,
                    queue_id=queue_id,
                    offset=offset,
                    max_messages=min(_PULL_BATCH, limit - len(out)),
                    max_bytes=_PULL_BYTES,
                    tag_expression="*",
                ),
            )
            for m in resp.messages:
                if m.store_timestamp_ms >= end:
                    # Store times follow offsets on a queue (one broker's clock): none later
                    # in the queue is in the range either.
                    return out
                if m.store_timestamp_ms >= begin:
                    out.append(ReceivedMessage.from_proto(m, broker))
            if resp.next_offset <= offset:
                break
            offset = resp.next_offset
        return out[:limit]

    async def message_history(self, msg_id: str) -> MessageHistory:
        """The message's life, in time order: stored (when, where, sent by which host), and for
        every consumer group what its broker recorded: deliveries (to which client, attempt,
        invisible until), changes of invisible time, nacks, the ends of unsettled deliveries,
        the ack or the dead-lettering; for pull (offsets) groups, whether their committed
        offset is past the message. ``truncated`` when the broker's scan hit its bound."""
        message = await self.view_message(msg_id)
        request = broker_pb2.GetMessageHistoryRequest(
            topic=message.topic,
            queue_id=message.queue_id,
            queue_offset=message.queue_offset,
            store_timestamp_ms=message.store_timestamp_ms,
        )
        addresses = [a for name, a in await self._broker_addresses() if name == message.broker]
        if not addresses:
            raise RouteNotFoundError(
                f"broker group {message.broker} has no broker now", code="ROUTE_NOT_FOUND"
            )
        last: TidemqError | None = None
        for address in addresses:  # the master first; any slave holds the same log
            try:
                answer = await self._call(
                    address, "GetMessageHistory", request, timeout_s=HISTORY_TIMEOUT_S
                )
            except TidemqError as e:
                if not e.retriable:
                    raise
                last = e
                continue
            return assemble_history(message, answer, int(time.time() * 1000))
        assert last is not None
        raise last


class Messages:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncMessages
        _runner: LoopThread

    def _run_messages(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def view_message(self, msg_id: str) -> ReceivedMessage:
        return self._run_messages(self._core.view_message(msg_id))

    def find_messages(
        self,
        topic: str,
        *,
        key: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 100,
    ) -> list[ReceivedMessage]:
        return self._run_messages(
            self._core.find_messages(topic, key=key, begin_ms=begin_ms, end_ms=end_ms, limit=limit)
        )

    def message_history(self, msg_id: str) -> MessageHistory:
        return self._run_messages(self._core.message_history(msg_id))
