"""Where a topic lives: the nameserver client and the SDK's route cache.

A route lists the broker groups serving a topic, each with its queue counts, permission and
broker addresses (id 0 is the master). Producers write to masters; consumers read from the
master, or from a slave while the master is absent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from tidemq._runtime import Channels
from tidemq.errors import RouteNotFoundError, TidemqError, from_rpc_error
from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc

log = logging.getLogger(__name__)

PERM_WRITE = 2
PERM_READ = 4
MASTER_ID = 0
# RocketMQ's AUTO_CREATE_TOPIC_KEY_TOPIC: the route of brokers that create topics on first send.
AUTO_CREATE_TOPIC = "TBW102"
NAMESERVER_TIMEOUT_S = 5.0
AUTO_CREATE_ROUTE_AGE_S = 1.0


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker group; ordered so every client sorts alike."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(frozen=True)
class BrokerGroup:
    broker_name: str
    cluster: str
    addresses: dict[int, str]  # broker id -> address; 0 is the master
    epoch: int = 0

    @property
    def master(self) -> str | None:
        return self.addresses.get(MASTER_ID)

    def read_address(self) -> str | None:
        """The master, else the lowest-numbered slave (a group whose master is down)."""
        if MASTER_ID in self.addresses:
            return self.addresses[MASTER_ID]
        return self.addresses[min(self.addresses)] if self.addresses else None


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    groups: dict[str, BrokerGroup]
    write_queues: tuple[MessageQueue, ...]  # on groups with a master and write permission
    read_queues: tuple[MessageQueue, ...]
    fetched_at: float = field(default=0.0, compare=False)

    @classmethod
    def from_proto(cls, topic: str, resp: Any, fetched_at: float = 0.0) -> TopicRoute:
        groups: dict[str, BrokerGroup] = {}
        for b in resp.brokers:
            old = groups.get(b.broker_name)
            # Two claims for one group (a failover in flight): the higher epoch is the truth.
            if old is None or b.epoch > old.epoch:
                groups[b.broker_name] = BrokerGroup(
                    b.broker_name, b.cluster, dict(b.addresses), b.epoch
                )
        write: list[MessageQueue] = []
        read: list[MessageQueue] = []
        for q in resp.queues:
            group = groups.get(q.broker_name)
            if group is None:
                continue
            if q.perm & PERM_WRITE and group.master is not None:
                write += [MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums)]
            if q.perm & PERM_READ:
                read += [MessageQueue(topic, q.broker_name, i) for i in range(q.read_queue_nums)]
        return cls(topic, groups, tuple(sorted(write)), tuple(sorted(read)), fetched_at)

    def for_topic(self, topic: str) -> TopicRoute:
        """This route's brokers and queue counts for another topic (the auto-create route)."""
        return TopicRoute(
            topic,
            self.groups,
            tuple(MessageQueue(topic, q.broker_name, q.queue_id) for q in self.write_queues),
            tuple(MessageQueue(topic, q.broker_name, q.queue_id) for q in self.read_queues),
            self.fetched_at,
        )


class NameServerClient:
    """Asks the nameservers in turn, starting with the one that answered last."""

    def __init__(self, addresses: Sequence[str], channels: Channels) -> None:
        self.addresses = list(addresses)
        self._channels = channels
        self._preferred = 0

    async def call(self, method: str, request: Any, timeout_s: float = NAMESERVER_TIMEOUT_S) -> Any:
        last: TidemqError | None = None
        n = len(self.addresses)
        for i in range(n):
            index = (self._preferred + i) % n
            address = self.addresses[index]
            stub = self._channels.stub(address, nameserver_pb2_grpc.NameServerStub)
            try:
                resp = await getattr(stub, method)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                last = from_rpc_error(e, f"nameserver {address}")
                if not last.retriable:
                    raise last from None  # a real answer (e.g. ROUTE_NOT_FOUND): same everywhere
                continue
            self._preferred = index
            return resp
        assert last is not None
        raise last

    async def query_route(self, topic: str) -> TopicRoute:
        resp = await self.call("QueryRoute", nameserver_pb2.QueryRouteRequest(topic=topic))
        return TopicRoute.from_proto(topic, resp, time.monotonic())

    async def cluster_info(self) -> Any:
        return await self.call("GetClusterInfo", nameserver_pb2.GetClusterInfoRequest())


class RouteCache:
    """Routes by topic, refreshed when older than ``max_age_s`` or when a caller saw an error.

    A topic no nameserver knows falls back to the auto-create route, as RocketMQ's producer
    does, so the first send to a new topic reaches a broker that will create it.
    """

    def __init__(self, nameserver: NameServerClient, max_age_s: float) -> None:
        self.nameserver = nameserver
        self.max_age_s = max_age_s
        self._routes: dict[str, TopicRoute] = {}
        self._fetching: dict[str, asyncio.Future[TopicRoute]] = {}

    def cached(self, topic: str) -> TopicRoute | None:
        route = self._routes.get(topic)
        if route is not None and time.monotonic() - route.fetched_at < self.max_age_s:
            return route
        return None

    def last_known(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    def invalidate(self, topic: str) -> None:
        route = self._routes.get(topic)
        if route is not None:
            # Keep it as a fallback while the nameservers are unreachable; just mark it old.
            self._routes[topic] = TopicRoute(
                route.topic, route.groups, route.write_queues, route.read_queues, 0.0
            )

    async def get(self, topic: str, *, allow_auto_create: bool = False) -> TopicRoute:
        route = self.cached(topic)
        if route is not None:
            return route
        # One fetch per topic at a time, however many sends are waiting for it.
        pending = self._fetching.get(topic)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(topic, allow_auto_create))
            self._fetching[topic] = pending
            pending.add_done_callback(lambda _: self._fetching.pop(topic, None))
        return await asyncio.shield(pending)

    async def _fetch(self, topic: str, allow_auto_create: bool) -> TopicRoute:
        try:
            route = await self.nameserver.query_route(topic)
        except RouteNotFoundError:
            if not allow_auto_create:
                raise
            try:
                auto = await self.nameserver.query_route(AUTO_CREATE_TOPIC)
            except RouteNotFoundError:
                raise RouteNotFoundError(
                    f"no broker serves topic {topic!r} and none creates topics on first send",
                    code="ROUTE_NOT_FOUND",
                ) from None
            # Kept for a second only: the real route replaces it once a broker has created the
            # topic and registered it.
            guess = auto.for_topic(topic)
            guess = TopicRoute(
                topic,
                guess.groups,
                guess.write_queues,
                guess.read_queues,
                time.monotonic() - self.max_age_s + AUTO_CREATE_ROUTE_AGE_S,
            )
            self._routes[topic] = guess
            return guess
        except TidemqError:
            stale = self._routes.get(topic)
            if stale is not None:
                log.warning("nameservers unreachable; using the last known route of %r", topic)
                return stale
            raise
        self._routes[topic] = route
        return route

    def topics(self) -> list[str]:
        return list(self._routes)

    async def refresh_all(self) -> None:
        """Re-read every known route; what cannot be read now keeps its last known value."""
        for topic in list(self._routes):
            try:
                self._routes[topic] = await self.nameserver.query_route(topic)
            except RouteNotFoundError:
                self._routes.pop(topic, None)  # deleted: the next send asks again
            except TidemqError as e:
                log.debug("route refresh of %r failed: %s", topic, e)
