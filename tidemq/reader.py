"""``QueueReader``: read one queue by offset, outside any consumer group.

A ``Consumer`` owns queues as a member of a group and keeps its position on the brokers. Tools
that keep positions themselves (a Spark query keeps them in its checkpoint, a backup job in its
own state) need the plain operation underneath: "give me the messages of this queue from offset
X". ``pull`` is one such call; ``read_range`` reads ``[start, end)`` completely, waiting for a
master that restarts and for a slave that has not replicated that far yet.

Reads go to the queue's master, or to a slave while the route has no master for the group.
No heartbeat, no membership, no committed offsets: the brokers never learn of the reader.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidemq._runtime import Channels, LoopThread, nameserver_addresses
from tidemq.errors import DataLossError, TidemqError, from_rpc_error
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings
from tidemq.routes import MessageQueue, NameServerClient, RouteCache
from tidemq.types import ReceivedMessage

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
# The broker answers at most this many messages per pull.
MAX_PULL_MESSAGES = 1024
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


class PullStatus(enum.Enum):
    FOUND = broker_pb2.FOUND
    # At the head of the queue (after the long-polling wait, if one was asked for).
    NO_NEW_MESSAGE = broker_pb2.NO_NEW_MESSAGE
    # Entries were scanned but none matched the tags; continue at ``next_offset``.
    NO_MATCHED_MESSAGE = broker_pb2.NO_MATCHED_MESSAGE
    # Below the queue's minimum: retention deleted those messages.
    OFFSET_TOO_SMALL = broker_pb2.OFFSET_TOO_SMALL
    # Past the queue's end on the broker that answered.
    OFFSET_OVERFLOW = broker_pb2.OFFSET_OVERFLOW


@dataclass(frozen=True)
class PullResult:
    status: PullStatus
    messages: list[ReceivedMessage]
    next_offset: int  # where the next pull of this queue starts
    min_offset: int  # the queue's valid range on the broker that answered
    max_offset: int


@dataclass(frozen=True)
class ReaderConfig:
    route_refresh_ms: int = 30_000
    # read_range keeps retrying a broker that does not answer (or a slave behind the range)
    # this long before it gives up with the last error.
    retry_timeout_ms: int = 60_000
    # TLS (docs/security.md): TlsSettings (a CA, and a client certificate for mutual TLS), True
    # (the system's roots), False (plaintext), or None: the TIDEMQ_TLS_* variables decide.
    tls: TlsSettings | bool | None = None
    # Credentials (docs/security.md): every request is signed with this access key and secret
    # key; False: none; None: the TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY variables decide.
    credentials: Credentials | bool | None = None

    def __post_init__(self) -> None:
        if self.route_refresh_ms <= 0 or self.retry_timeout_ms <= 0:
            raise ValueError("route_refresh_ms and retry_timeout_ms must be > 0")


class AsyncQueueReader:
    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        self.config = ReaderConfig(**settings)
        self._channels = Channels(self.config.tls, self.config.credentials)
        self._nameserver = NameServerClient(nameserver_addresses(nameserver), self._channels)
        self.routes = RouteCache(self._nameserver, self.config.route_refresh_ms / 1000)

    async def close(self) -> None:
        await self._channels.close()

    async def __aenter__(self) -> AsyncQueueReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def read_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic``, sorted."""
        return list((await self.routes.get(topic)).read_queues)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int = 4 << 20,
        tags: str = "*",
        long_poll_ms: int = 0,
    ) -> PullResult:
        """One pull: up to ``max_messages`` (at most 1024) of ``mq`` from ``offset``. With
        ``long_poll_ms`` the broker waits that long at the head of the queue for new ones."""
        if offset < 0 or not 0 < max_messages <= MAX_PULL_MESSAGES or max_bytes <= 0:
            raise ValueError(
                f"offset must be >= 0, max_messages in 1..{MAX_PULL_MESSAGES}, max_bytes > 0"
            )
        address = await self._address(mq)
        request = broker_pb2.PullMessageRequest(
            topic=mq.topic,
            queue_id=mq.queue_id,
            offset=offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            tag_expression=tags,
            long_poll_timeout_ms=long_poll_ms,
        )
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            resp = await stub.PullMessage(request, timeout=long_poll_ms / 1000 + CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            self.routes.invalidate(mq.topic)
            raise from_rpc_error(e, f"broker {mq.broker_name} at {address}") from None
        broker = mq.broker_name
        return PullResult(
            PullStatus(resp.status),
            [ReceivedMessage.from_proto(m, broker) for m in resp.messages],
            int(resp.next_offset),
            int(resp.min_offset),
            int(resp.max_offset),
        )

    async def read_range(
        self,
        mq: MessageQueue,
        start: int,
        end: int,
        *,
        tags: str = "*",
        fail_on_data_loss: bool = True,
        max_messages: int = MAX_PULL_MESSAGES,
        max_bytes: int = 4 << 20,
    ) -> AsyncGenerator[list[ReceivedMessage], None]:
        """Every message of ``mq`` with ``start <= queue_offset < end`` (those matching
        ``tags``), in batches, in offset order.

        The range must have existed on the master (``end`` at most its max offset when it was
        planned). Messages below the queue's minimum were deleted by retention: with
        ``fail_on_data_loss`` that raises ``DataLossError``, otherwise the gap is skipped.
        A broker that does not answer, or a slave that has not replicated up to ``end`` yet,
        is retried for ``retry_timeout_ms``.
        """
        offset = start
        retry = _Retry(self.config.retry_timeout_ms)
        while offset < end:
            try:
                r = await self.pull(
                    mq,
                    offset,
                    max_messages=min(max_messages, end - offset),
                    max_bytes=max_bytes,
                    tags=tags,
                    long_poll_ms=0 if retry.attempts == 0 else 500,
                )
            except TidemqError as e:
                if not e.retriable:
                    raise
                await retry.wait(e)
                continue
            if r.status is PullStatus.OFFSET_TOO_SMALL:
                lost = DataLossError(
                    f"{mq}: offsets [{offset}, {min(r.min_offset, end)}) were deleted by "
                    f"retention (the queue now starts at {r.min_offset})",
                    code="DATA_LOSS",
                    min_offset=r.min_offset,
                    max_offset=r.max_offset,
                )
                if fail_on_data_loss:
                    raise lost
                log.warning("skipping lost messages: %s", lost)
                offset = r.next_offset
                continue
            if r.status in (PullStatus.OFFSET_OVERFLOW, PullStatus.NO_NEW_MESSAGE):
                # The range is not visible on this broker yet: a slave catching up, a master
                # recovering, or a confirm offset waiting for slaves.
                await retry.wait(
                    TidemqError(
                        f"{mq}: offset {offset} of range [{start}, {end}) not readable "
                        f"(the broker's queue ends at {r.max_offset})",
                        code="OFFSET_OVERFLOW",
                        retriable=True,
                    )
                )
                continue
            retry.reset()
            batch = [m for m in r.messages if m.queue_offset < end]
            offset = r.next_offset
            if batch:
                yield batch

    async def _address(self, mq: MessageQueue) -> str:
        route = await self.routes.get(mq.topic)
        group = route.groups.get(mq.broker_name)
        address = group.read_address() if group is not None else None
        if address is None:
            self.routes.invalidate(mq.topic)
            raise TidemqError(
                f"broker group {mq.broker_name} of {mq.topic!r} is not routed",
                code="ROUTE_NOT_FOUND",
                retriable=True,
            )
        return address


class _Retry:
    """Backoff between attempts, failing with the last error once ``timeout_ms`` has passed
    without progress."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_s = timeout_ms / 1000
        self.attempts = 0
        self._since = time.monotonic()

    def reset(self) -> None:
        self.attempts = 0
        self._since = time.monotonic()

    async def wait(self, error: TidemqError) -> None:
        if time.monotonic() - self._since > self.timeout_s:
            raise error
        self.attempts += 1
        await asyncio.sleep(min(RETRY_FIRST_S * 2 ** (self.attempts - 1), RETRY_MAX_S))


class QueueReader:
    """The blocking ``AsyncQueueReader``::

    with tidemq.QueueReader("127.0.0.1:9876") as reader:
        for mq in reader.read_queues("orders"):
            for batch in reader.read_range(mq, 0, 100):
                ...
    """

    def __init__(self, nameserver: str | Sequence[str] | None = None, **settings: Any) -> None:
        self._core = AsyncQueueReader(nameserver, **settings)
        self.config = self._core.config
        self._runner = LoopThread("tidemq-reader")

    def __enter__(self) -> QueueReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._runner.finish(self._core.close)

    def read_queues(self, topic: str) -> list[MessageQueue]:
        return self._runner.run(self._core.read_queues(topic))

    def pull(self, mq: MessageQueue, offset: int, **kwargs: Any) -> PullResult:
        return self._runner.run(self._core.pull(mq, offset, **kwargs))

    def read_range(
        self, mq: MessageQueue, start: int, end: int, **kwargs: Any
    ) -> Iterator[list[ReceivedMessage]]:
        batches = self._core.read_range(mq, start, end, **kwargs)
        try:
            while True:
                try:
                    yield self._runner.run(batches.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._runner.run(batches.aclose())
