"""The calls of one member of a receive group, shared by ``SimpleConsumer`` and
``PushConsumer``: heartbeats (model RECEIVE), receives from the masters of the subscribed
topics in turn, and acks, nacks, invisibility changes and dead-letters sent to the current
master of the message's broker group (after a failover, the new master: the handle names the
group, not a broker). Retriable errors are retried with the SDK's tenacity policy
(``_runtime.backoff``) within ``request_timeout_ms``, re-reading the route each time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay

from tidemq._runtime import Channels, backoff, nameserver_addresses
from tidemq.consumer.receive_config import (
    PushConsumerConfig,
    SimpleConsumerConfig,
    start_from_text,
)
from tidemq.consumer.settling import per_handle
from tidemq.errors import (
    BrokerUnavailableError,
    ConsumeModelMismatch,
    ReceiptHandleExpired,
    RouteNotFoundError,
    TidemqError,
    from_rpc_error,
    is_retriable,
)
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings
from tidemq.routes import NameServerClient, RouteCache
from tidemq.types import ReceivedMessage

if TYPE_CHECKING:
    from tidemq.metrics import ClientMetrics

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Target:
    """Where a receive goes: one subscribed topic on one broker group's master."""

    topic: str
    broker: str
    address: str


class ReceiveCalls:
    @classmethod
    def for_consumer(
        cls,
        nameserver: str | Sequence[str] | None,
        group: str,
        subscriptions: dict[str, str],
        client_id: str,
        config: SimpleConsumerConfig | PushConsumerConfig,
    ) -> ReceiveCalls:
        """The calls of a simple or push consumer, from the settings both kinds share."""
        return cls(
            nameserver,
            group=group,
            subscriptions=subscriptions,
            client_id=client_id,
            start_from=start_from_text(config.start_from),
            request_timeout_ms=config.request_timeout_ms,
            route_refresh_ms=config.route_refresh_ms,
            tls=config.tls,
            credentials=config.credentials,
            metrics=config.metrics,
        )

    def __init__(
        self,
        nameserver: str | Sequence[str] | None,
        *,
        group: str,
        subscriptions: dict[str, str],
        client_id: str,
        start_from: str,
        request_timeout_ms: int,
        route_refresh_ms: int,
        tls: TlsSettings | bool | None = None,
        credentials: Credentials | bool | None = None,
        metrics: ClientMetrics | None = None,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise ValueError("group is required")
        self.group = group
        self.subscriptions = subscriptions
        self.client_id = client_id
        self.start_from = start_from
        self.request_timeout_s = request_timeout_ms / 1000
        self._channels = Channels(tls, credentials)
        self._nameserver = NameServerClient(nameserver_addresses(nameserver), self._channels)
        self.routes = RouteCache(self._nameserver, route_refresh_ms / 1000)
        self._next_target = 0
        self.metrics = metrics

    async def close(self) -> None:
        await self._channels.close()

    # ------------------------------------------------------------------ membership
    async def heartbeat_all(self) -> list[TidemqError]:
        """One heartbeat to every broker of the subscribed topics; the errors, for the caller
        to judge (a model mismatch is fatal at start, anything else is retried next time)."""
        request = self.heartbeat_request()
        addresses = await self._all_addresses()
        outcomes = await asyncio.gather(
            *(self._call(a, "Heartbeat", request, CALL_TIMEOUT_S) for a in sorted(addresses)),
            return_exceptions=True,
        )
        errors = []
        for outcome in outcomes:
            if isinstance(outcome, TidemqError):
                errors.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return errors

    def heartbeat_request(self) -> Any:
        """The member and its subscriptions, as a receive-model (RECEIVE) member."""
        return broker_pb2.HeartbeatRequest(
            client_id=self.client_id,
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group=self.group,
                    mode=broker_pb2.CLUSTERING,
                    model=broker_pb2.RECEIVE,
                    subscriptions=[
                        broker_pb2.Subscription(topic=t, tag_expression=e)
                        for t, e in self.subscriptions.items()
                    ],
                )
            ],
        )

    async def unregister_all(self) -> None:
        request = broker_pb2.UnregisterClientRequest(client_id=self.client_id)
        try:
            addresses = await self._all_addresses()
        except TidemqError:
            return
        await asyncio.gather(
            *(self._call(a, "UnregisterClient", request, CALL_TIMEOUT_S) for a in addresses),
            return_exceptions=True,
        )

    async def _all_addresses(self) -> set[str]:
        addresses: set[str] = set()
        for topic in self.subscriptions:
            route = await self.routes.get(topic)
            for g in route.groups.values():
                addresses.update(g.addresses.values())
        return addresses

    # ------------------------------------------------------------------ receive
    async def targets(self) -> list[Target]:
        """Every (topic, broker group) a receive can go to: groups with a master serving a
        readable queue of a subscribed topic."""
        out = []
        for topic in self.subscriptions:
            route = await self.routes.get(topic)
            readable = {q.broker_name for q in route.read_queues}
            for name in sorted(readable):
                master = route.groups[name].master
                if master is not None:
                    out.append(Target(topic, name, master))
        return out

    async def receive(
        self, max_messages: int, invisible_ms: int, long_poll_ms: int
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages``, each invisible to the group's other members for
        ``invisible_ms``; waits up to ``long_poll_ms`` for some. [] when none came."""
        deadline = time.monotonic() + long_poll_ms / 1000
        attempts = AsyncRetrying(
            stop=stop_after_delay(max(self.request_timeout_s, long_poll_ms / 1000)),
            wait=backoff(),
            retry=retry_if_exception(is_retriable),
            reraise=True,
        )
        async for attempt in attempts:
            with attempt:
                return await self._receive_once(max_messages, invisible_ms, deadline)
        raise AssertionError("unreachable: tenacity reraises")

    async def _receive_once(
        self, max_messages: int, invisible_ms: int, deadline: float
    ) -> list[ReceivedMessage]:
        targets = await self.targets()
        if not targets:
            for topic in self.subscriptions:
                self.routes.invalidate(topic)
            raise RouteNotFoundError(
                f"no master serves a readable queue of {sorted(self.subscriptions)} now",
                code="NOT_MASTER",
                retriable=True,
            )
        start = self._next_target % len(targets)
        self._next_target += 1
        ordered = targets[start:] + targets[:start]
        if len(ordered) == 1:
            return await self._receive_from(ordered[0], max_messages, invisible_ms, deadline)
        # Several groups (or topics): look at each without waiting, in turn from a rotating
        # start, so one quiet group's long poll never hides another's messages; then wait on
        # the first that answered.
        answered: list[Target] = []
        first_error: TidemqError | None = None
        for t in ordered:
            try:
                got = await self._receive_from(t, max_messages, invisible_ms, 0.0)
            except TidemqError as e:
                if not e.retriable:
                    raise
                first_error = first_error or e
                continue
            if got:
                return got
            answered.append(t)
        if not answered:
            assert first_error is not None
            raise first_error
        return await self._receive_from(answered[0], max_messages, invisible_ms, deadline)

    async def _receive_from(
        self, t: Target, max_messages: int, invisible_ms: int, deadline: float
    ) -> list[ReceivedMessage]:
        wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
        request = self.receive_request(t.topic, max_messages, invisible_ms, wait_ms)
        try:
            resp = await self._call(
                t.address, "ReceiveMessage", request, wait_ms / 1000 + CALL_TIMEOUT_S
            )
        except TidemqError as e:
            if e.retriable:
                self.routes.invalidate(t.topic)
            raise
        if self.metrics is not None:
            self.metrics.received_from(t.topic, self.group, len(resp.messages))
        return [ReceivedMessage.from_received(r, t.broker) for r in resp.messages]

    def receive_request(
        self, topic: str, max_messages: int, invisible_ms: int, wait_ms: int
    ) -> Any:
        """A receive from any queue of ``topic`` on one broker (queue_id -1: the broker
        rotates over its queues)."""
        return broker_pb2.ReceiveMessageRequest(
            group=self.group,
            topic=topic,
            queue_id=-1,
            tag_expression=self.subscriptions[topic],
            max_messages=max_messages,
            invisible_duration_ms=invisible_ms,
            long_poll_timeout_ms=wait_ms,
            client_id=self.client_id,
            start_from=self.start_from,
        )

    # ------------------------------------------------------------------ settle
    async def ack(self, topic: str, broker: str, handles: list[str]) -> list[TidemqError | None]:
        """One result per handle: None when this call's ack completed the message. A retried
        call's MESSAGE_ALREADY_ACKED stays an error: the unanswered first attempt may have done
        it, or (its handle expired meanwhile) another member acked a later delivery; the broker
        cannot tell which, so "acked" would promise what may be false."""
        request = broker_pb2.AckMessageRequest(
            group=self.group, topic=topic, receipt_handles=handles
        )
        try:
            resp, _ = await self.to_master(topic, broker, "AckMessage", request)
        except TidemqError as e:
            self._settled("ack", topic, [e] * len(handles))
            raise
        results = per_handle(resp.results, handles, f"broker group {broker}")
        self._settled("ack", topic, results)
        return results

    async def nack(self, topic: str, broker: str, handles: list[str]) -> list[TidemqError | None]:
        request = broker_pb2.NackMessageRequest(
            group=self.group, topic=topic, receipt_handles=handles
        )
        try:
            resp, retried = await self.to_master(topic, broker, "NackMessage", request)
        except TidemqError as e:
            self._settled("nack", topic, [e] * len(handles))
            raise
        results = per_handle(resp.results, handles, f"broker group {broker}")
        results = nacked_after_retry(results) if retried else results
        self._settled("nack", topic, results)
        return results

    def _settled(self, kind: str, topic: str, results: list[TidemqError | None]) -> None:
        if self.metrics is not None:
            self.metrics.settled(kind, topic, self.group, results)

    async def change_invisible_duration(self, message: ReceivedMessage, invisible_ms: int) -> None:
        request = broker_pb2.ChangeInvisibleDurationRequest(
            group=self.group,
            topic=message.topic,
            receipt_handle=message.receipt_handle,
            invisible_duration_ms=invisible_ms,
        )
        resp, _ = await self.to_master(
            message.topic, message.broker, "ChangeInvisibleDuration", request
        )
        message.renew(resp.receipt_handle, resp.invisible_until_ms)

    async def dead_letter(self, message: ReceivedMessage, reason: str) -> tuple[str, int]:
        """Where the message went: the DLQ topic and its queue offset there."""
        request = broker_pb2.DeadLetterMessageRequest(
            group=self.group,
            topic=message.topic,
            receipt_handle=message.receipt_handle,
            reason=reason,
        )
        resp, _ = await self.to_master(message.topic, message.broker, "DeadLetterMessage", request)
        return resp.dlq_topic, int(resp.dlq_queue_offset)

    async def to_master(
        self, topic: str, broker: str, method: str, request: Any
    ) -> tuple[Any, bool]:
        """The answer of the current master of ``broker``'s group, and whether it took more
        than one attempt."""
        attempts = AsyncRetrying(
            stop=stop_after_delay(self.request_timeout_s),
            wait=backoff(),
            retry=retry_if_exception(is_retriable),
            reraise=True,
        )
        async for attempt in attempts:
            with attempt:
                route = await self.routes.get(topic)
                group = route.groups.get(broker)
                address = group.master if group is not None else None
                if address is None:
                    self.routes.invalidate(topic)
                    raise BrokerUnavailableError(
                        f"broker group {broker} of {topic!r} has no master now",
                        code="NOT_MASTER",
                        retriable=True,
                    )
                try:
                    resp = await self._call(address, method, request, CALL_TIMEOUT_S)
                except TidemqError as e:
                    if e.retriable:
                        self.routes.invalidate(topic)
                    raise
                return resp, attempt.retry_state.attempt_number > 1
        raise AssertionError("unreachable: tenacity reraises")

    async def _call(self, address: str, method: str, request: Any, timeout_s: float) -> Any:
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            return await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, f"broker {address}") from None


async def start_membership(calls: ReceiveCalls) -> None:
    """The first heartbeat: a model mismatch stops the start; other failures are retried by
    the heartbeat loop (a broker that is restarting)."""
    for error in await calls.heartbeat_all():
        if isinstance(error, ConsumeModelMismatch):
            await calls.close()
            raise error
        log.warning("heartbeat of %s failed: %s", calls.group, error)


async def heartbeat_loop(calls: ReceiveCalls, interval_ms: int) -> None:
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            errors = await calls.heartbeat_all()
        except TidemqError as e:
            errors = [e]
        for error in errors:
            log.warning("heartbeat of %s failed: %s", calls.group, error)


def nacked_after_retry(results: list[TidemqError | None]) -> list[TidemqError | None]:
    """Per-handle results of a nack call that was retried: an earlier attempt that timed out
    (or crossed a failover) may have released the handle, which the retry sees as expired.
    Counting that as nacked is safe whoever released it: the message is delivered again
    either way. (A retried ack gets no such reading: ``ack``.)"""
    return [None if isinstance(e, ReceiptHandleExpired) else e for e in results]
