"""The sender and its retry policy: delivers a batch to its broker groups, one SendMessage
request each, and answers every message in it; what failed retriably is moved (``routing``)
and sent again, within the send timeout (tenacity; the rules are in ``tidemq.producer``)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from tidemq._runtime import Channels, backoff, monotonic_ms
from tidemq.errors import RequestTimeoutError, RouteNotFoundError, TidemqError, from_rpc_error
from tidemq.producer.blocks import Block, BlockAnswer
from tidemq.producer.config import ProducerConfig, ProducerStats
from tidemq.producer.futures import MessageFuture, Unanswered
from tidemq.producer.idempotence import ProducerIdentity
from tidemq.producer.metering import record_answer, record_retry
from tidemq.producer.pending import Pending
from tidemq.producer.routing import QueueSelector
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.protos.record_blocks import encode_send_request
from tidemq.routes import MessageQueue
from tidemq.types import MESSAGE_GROUP_PROPERTY, SendResult, send_status

log = logging.getLogger(__name__)

Sendable = Pending | Block  # what a batch holds: messages, or record blocks of messages


class _Retriable(Exception):
    """Inside ``deliver``: an attempt left these messages to retry, failed with ``error``."""

    def __init__(self, error: TidemqError, left: list[Sendable]) -> None:
        super().__init__(str(error))
        self.error = error
        self.left = left
        # Idempotent messages keep their queue and are retried until their deadline: a
        # retry cannot store them twice.
        self.keep_trying = bool(left) and all(p.sequence >= 0 for p in left)


def add_to_request(request: Any, p: Pending) -> None:
    """``p`` as one message of a SendMessage request, on its queue."""
    m = request.messages.add(
        topic=p.topic,
        body=p.body,
        queue_id=p.queue.queue_id if p.queue else 0,
        born_timestamp_ms=p.born_ms,
        tag=p.tag,
        sequence=max(p.sequence, 0),
    )
    if p.keys:
        m.keys.extend(p.keys)
    if p.properties:
        m.properties.update(p.properties)
    if p.sharding_key is not None:
        m.properties[MESSAGE_GROUP_PROPERTY] = p.sharding_key
    if p.delivery is not None:
        m.deliver_at_ms, m.delay_ms, m.delay_level = p.delivery


def block_request(request: Any, blocks: list[Block]) -> bytes:
    """A SendMessage request of record blocks (one topic's), encoded: ``request`` holds the
    other fields."""
    request.block_topic = blocks[0].topic
    encoded = []
    for b in blocks:
        assert b.queue is not None  # placed before it is sent
        encoded.append((b.queue.queue_id, b.records(), b.count, max(b.sequence, 0)))
    return encode_send_request(request.SerializeToString(), encoded)


class _EncodedSend:
    """SendMessage taking a request encoded already (``block_request``)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = channel.unary_unary(
            "/tidemq.v1.Broker/SendMessage",
            request_serializer=None,  # bytes as they are
            response_deserializer=broker_pb2.SendMessageResponse.FromString,
        )


class Sender:
    """Sends batches the accumulator sealed (and ``send_batch``'s atomic ones) as
    SendMessage requests, one per broker group."""

    def __init__(
        self,
        config: ProducerConfig,
        channels: Channels,
        selector: QueueSelector,
        unanswered: Unanswered,
        stats: ProducerStats,
        identity: ProducerIdentity | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self._channels = channels
        self._selector = selector
        self._unanswered = unanswered
        self.stats = stats
        self.metrics = config.metrics

    async def deliver(self, batch: Sequence[Sendable]) -> None:
        """Send, retrying what failed retriably; every future ends done."""
        remaining = list(batch)
        failed_on: set[str] = set()
        try:
            try:
                # Most batches succeed at once: the first attempt skips the retry machinery,
                # whose setup costs more than a small send.
                await self._send_once(remaining, failed_on)
            except _Retriable as e:
                remaining = e.left
                if not self.config.retries:
                    raise e.error from None
            else:
                return
            # RocketMQ retries on another broker group at once; tenacity backs off after that.
            timeout_s = max(0.0, min(p.deadline for p in remaining) - time.monotonic())
            attempts = AsyncRetrying(
                stop=_RetryBudget(self.config.retries, timeout_s),
                wait=_wait_for(backoff()),
                retry=retry_if_exception(lambda e: isinstance(e, _Retriable)),
                reraise=True,
            )
            try:
                async for attempt in attempts:
                    with attempt:
                        remaining = await self._reroute(remaining, frozenset(failed_on))
                        if self.metrics is not None:
                            record_retry(self.metrics, remaining)
                        await self._send_once(remaining, failed_on)
            except _Retriable as e:
                remaining = e.left
                raise e.error from None
        except TidemqError as e:
            for p in remaining:
                self._fail(p, e)
        except Exception as e:  # a bug must still answer every caller
            log.exception("send failed unexpectedly")
            for p in remaining:
                self._fail(p, TidemqError(f"{type(e).__name__}: {e}"))

    def _fail(self, p: Sendable, error: TidemqError) -> None:
        self._unanswered.fail(p, error)
        if p.sequence >= 0 and self.identity is not None:
            self.identity.settle(p, stored=False)

    def _complete_blocks(self, group: list[Block], resp: Any, broker: str, address: str) -> None:
        status = send_status(resp.block_status)
        host, port, epoch = resp.store_host, resp.store_port, resp.epoch
        complete = self._unanswered.complete_block
        for block, r in zip(group, resp.block_results, strict=True):
            complete(
                block,
                BlockAnswer(
                    status, broker, epoch, address, host, port, r.first_queue_offset,
                    r.first_commitlog_offset, r.added_bytes, r.head_added_bytes,
                    list(r.file_start_indexes), list(r.file_start_offsets), r.duplicate,
                ),
            )  # fmt: skip

    def _gap(self, group: list[Sendable], err: TidemqError, sent_s: float) -> list[Sendable]:
        """What of a request refused with SEQUENCE_GAP is worth sending again: the messages
        behind an earlier send of their queue that is still on its way, or that was answered
        after this request left (it may have reached the broker just after this one). The
        others fail: what they wait for will never come."""
        identity = self.identity
        assert identity is not None
        again = []
        for p in group:
            if identity.earlier_unresolved(p) or identity.settled_since(p, sent_s):
                again.append(p)
            else:
                self._fail(p, err)
        return again

    async def _reroute(self, batch: list[Sendable], avoid: frozenset[str]) -> list[Sendable]:
        chosen: dict[tuple[str, int], MessageQueue] = {}
        for p in batch:
            topic = p.topic
            self._selector.routes.invalidate(topic)
            route = await self._selector.route(topic)
            if p.sequence >= 0:
                continue  # idempotent: its queue and sequence go together, to the same group
            key = (topic, p.batch_id)
            if p.batch_id and key in chosen:
                p.queue = chosen[key]
                continue
            if p.sharding_key is not None and p.queue in route.write_queues:
                queue = p.queue
            else:
                try:
                    queue = self._selector.select(route, p, avoid)
                except TidemqError as e:
                    if not e.retriable:
                        raise
                    raise _Retriable(e, batch) from None  # no master yet: a failover
            assert queue is not None
            chosen[key] = queue
            p.queue = queue
        return batch

    async def _send_once(self, batch: list[Sendable], failed_on: set[str]) -> None:
        """One attempt; raises ``_Retriable`` with what is left to retry (everything else is
        answered: sent, or failed for good)."""
        # One request per broker group (and producer epoch: an idempotent request has one);
        # record blocks travel in requests of their own, one topic each.
        by_broker: dict[tuple[str, int, str | None], list[Sendable]] = {}
        for p in batch:
            assert p.queue is not None
            key = (p.queue.broker_name, p.producer_epoch, p.topic if type(p) is Block else None)
            by_broker.setdefault(key, []).append(p)
        if len(by_broker) == 1:
            [((broker, _, _), group)] = by_broker.items()
            outcomes = [await self._send_to(broker, group)]
        else:
            outcomes = await asyncio.gather(
                *(self._send_to(broker, group) for (broker, _, _), group in by_broker.items())
            )
        left: list[Sendable] = []
        error: TidemqError | None = None
        for (broker, _, _), (group, err) in zip(by_broker, outcomes, strict=True):
            if err is None:
                continue
            if err.retriable:
                failed_on.add(broker)
                left += group
                error = error or err
            else:
                for p in group:
                    self._fail(p, err)
        if error is not None:
            raise _Retriable(error, left)

    async def _send_to(
        self, broker: str, group: list[Sendable]
    ) -> tuple[list[Sendable], TidemqError | None]:
        topic = group[0].topic
        route = self._selector.routes.last_known(topic)
        address = None
        if route is not None and broker in route.groups:
            address = route.groups[broker].master
        if address is None:
            route = await self._selector.route(topic)
            g = route.groups.get(broker)
            address = g.master if g else None
        if address is None:
            return group, RouteNotFoundError(
                f"broker group {broker} has no master now", code="NOT_MASTER", retriable=True
            )
        timeout_s = min(p.deadline for p in group) - time.monotonic()
        idempotent = group[0].sequence >= 0 and self.identity is not None
        if idempotent:
            timeout_s = min(timeout_s, self.config.attempt_timeout_ms / 1000)
        if timeout_s <= 0:
            return group, RequestTimeoutError(
                f"send timed out after {self.config.send_timeout_ms} ms",
                code="TIMEOUT",
                retriable=False,
            )
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        # The route's epoch: a superseded master refuses it (STALE_EPOCH) instead of storing.
        epoch = route.groups[broker].epoch if route is not None and broker in route.groups else 0
        request = broker_pb2.SendMessageRequest(producer_group=self.config.group, epoch=epoch)
        if idempotent:
            assert self.identity is not None
            request.producer_id = self.identity.producer_id
            request.producer_epoch = group[0].producer_epoch
        blocks = [p for p in group if type(p) is Block]
        messages = [p for p in group if type(p) is Pending]
        encoded = block_request(request, blocks) if blocks else None
        for p in messages:
            add_to_request(request, p)
        started = time.monotonic()
        self.stats.requests += 1
        self.stats.messages += sum(p.count for p in group)
        fault = self._selector.fault
        try:
            if encoded is not None:
                send = self._channels.stub(address, _EncodedSend).call
                resp = await send(encoded, timeout=timeout_s)
            else:
                resp = await stub.SendMessage(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e, f"broker {broker} at {address}")
            self.stats.failed_requests += 1
            if err.code == "SEQUENCE_GAP" and self.identity is not None:
                return self._gap(group, err, started), err
            if err.retriable:
                fault.record_failure(broker, monotonic_ms())
            return group, err
        fault.record_latency(broker, (time.monotonic() - started) * 1000, monotonic_ms())
        if self.metrics is not None:
            record_answer(self.metrics, blocks, messages, resp, self.config.send_timeout_ms / 1000)
        name = resp.broker_name or broker
        epoch = resp.epoch
        if blocks:
            self._complete_blocks(blocks, resp, name, address)
            if idempotent:
                assert self.identity is not None
                self.identity.settle_stored(group)
            return group, None
        complete = self._unanswered.complete
        for p, r in zip(messages, resp.results, strict=True):
            result = SendResult(
                send_status(r.status),
                r.msg_id,
                r.queue_id,
                r.queue_offset,
                name,
                p.topic,
                r.commitlog_offset,
                epoch,
                address,
                r.transaction_id,
                r.recall_handle,
                r.deliver_at_ms,
                r.duplicate,
            )
            complete(p, result, wake=False)
        if idempotent:
            assert self.identity is not None
            self.identity.settle_stored(group)
        # Blocked callers are woken once for the whole answer, not once per message.
        for p in messages:
            if type(p.future) is MessageFuture:
                p.future.wake_waiters()
                break
        return group, None


# Errors that mean "this group is changing masters": worth retrying until the send timeout,
# however many attempts that takes, since the group heals itself within seconds.
_FAILOVER_CODES = frozenset({"NOT_MASTER", "STALE_EPOCH", "ROUTE_NOT_FOUND", "UNAVAILABLE"})
FAILOVER_POLL_S = 0.05


def _failing_over(state: RetryCallState) -> bool:
    """The last attempt failed because its group is changing masters."""
    exc = state.outcome.exception() if state.outcome is not None else None
    return isinstance(exc, _Retriable) and (exc.keep_trying or exc.error.code in _FAILOVER_CODES)


class _RetryBudget(stop_base):
    """At most ``retries`` more attempts, within ``timeout_s`` in all; a failover in progress
    (no master, a superseded one) is retried until the timeout alone."""

    def __init__(self, retries: int, timeout_s: float) -> None:
        self.retries = retries
        self.timeout_s = timeout_s

    def __call__(self, state: RetryCallState) -> bool:
        elapsed = state.seconds_since_start or 0.0
        if elapsed >= self.timeout_s:
            return True
        if _failing_over(state):
            return False
        return state.attempt_number >= self.retries


def _wait_for(other: wait_base) -> Callable[[RetryCallState], float]:
    """A failover in progress is polled every ~100 ms (a new master is elected within a
    second or two of the old one's session expiring); other errors back off as ``other``."""

    def wait(state: RetryCallState) -> float:
        if _failing_over(state):
            return FAILOVER_POLL_S + random.uniform(0, FAILOVER_POLL_S)
        return float(other(state))

    return wait
