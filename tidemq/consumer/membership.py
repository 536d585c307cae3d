"""Group membership: heartbeats to every broker of the subscribed topics, leaving at close,
and which queues this member should own. Clustering splits the topics' queues among the live
members (``allocate.allocate_averagely``); broadcasting gives every member every queue."""

from __future__ import annotations

import asyncio

from tidemq.allocate import allocate_averagely
from tidemq.consumer.brokers import Brokers
from tidemq.consumer.config import ConsumerConfig
from tidemq.errors import TidemqError
from tidemq.protos import broker_pb2
from tidemq.routes import MessageQueue, TopicRoute


class Membership:
    """One member (``client_id``) of ``group``, subscribed to ``topics``."""

    def __init__(
        self,
        client_id: str,
        group: str,
        topics: tuple[str, ...],
        config: ConsumerConfig,
        brokers: Brokers,
    ) -> None:
        self.client_id = client_id
        self.group = group
        self.topics = topics
        self.config = config
        self._brokers = brokers

    async def heartbeat_all(self) -> None:
        mode = (
            broker_pb2.CLUSTERING if self.config.mode == "clustering" else broker_pb2.BROADCASTING
        )
        request = broker_pb2.HeartbeatRequest(
            client_id=self.client_id,
            consumers=[
                broker_pb2.ConsumerGroupMembership(
                    group=self.group,
                    mode=mode,
                    subscriptions=[
                        broker_pb2.Subscription(topic=t, tag_expression=self.config.tags)
                        for t in self.topics
                    ],
                )
            ],
        )
        addresses = await self._all_broker_addresses()
        await asyncio.gather(*(self._brokers.call(a, "Heartbeat", request) for a in addresses))

    async def unregister_all(self) -> None:
        request = broker_pb2.UnregisterClientRequest(client_id=self.client_id)
        try:
            addresses = await self._all_broker_addresses()
        except TidemqError:
            return
        await asyncio.gather(
            *(self._brokers.call(a, "UnregisterClient", request) for a in addresses)
        )

    async def _all_broker_addresses(self) -> set[str]:
        addresses: set[str] = set()
        for topic in self.topics:
            route = await self._brokers.routes.get(topic)
            for g in route.groups.values():
                addresses.update(g.addresses.values())
        return addresses

    async def _members(self, route: TopicRoute) -> list[str]:
        # Every member asks the same broker group (the first by name), so all see one list;
        # its slaves know the members too (heartbeats go to every broker).
        for name in sorted(route.groups):
            for address in self._brokers.read_candidates(route.groups[name]):
                resp = await self._brokers.call(
                    address, "GetConsumerList", broker_pb2.GetConsumerListRequest(group=self.group)
                )
                if resp is not None:
                    return sorted(resp.client_ids)
        raise TidemqError(
            f"no broker of topic {route.topic!r} answered the member list of {self.group!r}",
            code="UNAVAILABLE",
            retriable=True,
        )

    async def wanted(self) -> set[MessageQueue]:
        """The queues this member should own now, from fresh routes and the member list."""
        wanted: set[MessageQueue] = set()
        for topic in self.topics:
            self._brokers.routes.invalidate(topic)
            route = await self._brokers.routes.get(topic)
            queues = list(route.read_queues)
            if self.config.mode == "clustering":
                members = await self._members(route)
                wanted.update(allocate_averagely(queues, members, self.client_id))
            else:
                wanted.update(queues)
        return wanted
