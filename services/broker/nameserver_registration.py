"""The broker's registration with its nameservers: a round every ``register_interval_ms`` (or
sooner when a topic change asks for one, ``publication``), each registering with every
nameserver at once; the answer says where the group's master is. On stop, unregistering.

Registrations are incremental: each nameserver is sent the topics changed since the data
version it last accepted (``TopicManager.changes_since``), so a heartbeat or a topic create
costs what changed, not every topic the broker holds. A nameserver that does not hold that
version (it restarted, or expired the broker) answers ``full_registration_needed`` and is sent
every topic at once; so is a nameserver never heard from, or one whose changes the broker's
change log no longer reaches back to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from tidemq.protos import common_pb2, nameserver_pb2, nameserver_pb2_grpc
from tidemq.protos.tls import aio_channel
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import broker_info, topic_proto, topic_protos
from tidemq.services.broker.publication import RegistrationRounds
from tidemq.services.broker.receive.dead_letter import is_system_topic
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import DataVersion, TopicManager
from tidemq.services.broker.zk_registration import ZkRegistration

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 5.0
CHANNEL_REOPEN_S = 300.0


class NameserverRegistration:
    """Registers one broker with every configured nameserver, round after round."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicManager,
        role: RoleState,
        rounds: RegistrationRounds,
        zk: ZkRegistration | None,
        on_master: Callable[[str, str], None],
        stepped_aside: Callable[[], bool],
    ) -> None:
        self.config = config
        self.topics = topics
        self.role = role
        self.rounds = rounds
        self.zk = zk
        self._on_master = on_master
        self._stepped_aside = stepped_aside
        # nameserver -> the topic data version it last accepted from this broker
        self._accepted: dict[str, DataVersion] = {}
        # nameserver -> its channel and when it was opened (loop time)
        self._channels: dict[str, tuple[grpc.aio.Channel, float]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _channel(self, nameserver: str) -> grpc.aio.Channel:
        """A channel kept across rounds: a new connection per registration would cost more
        than the registration. It is opened again every ``CHANNEL_REOPEN_S`` and after a
        failure, so rotated client certificates apply (TLS reads them when a channel opens)."""
        now = asyncio.get_running_loop().time()
        held = self._channels.get(nameserver)
        if held is not None and now - held[1] < CHANNEL_REOPEN_S:
            return held[0]
        if held is not None:
            self._retire(held[0])
        channel = aio_channel(
            nameserver, self.config.client_tls, credentials=self.config.client_credentials
        )
        self._channels[nameserver] = (channel, now)
        return channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        # Closing waits for calls in flight on it; the round does not wait for that.
        task = asyncio.get_running_loop().create_task(channel.close(grace=REGISTER_TIMEOUT_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the kept channels, once no round runs any more (at shutdown)."""
        channels = [c for c, _ in self._channels.values()]
        self._channels.clear()
        await asyncio.gather(*(c.close() for c in channels), *self._closing)

    async def run(self) -> None:
        self.rounds.request()  # the first round runs at once
        while True:
            ticket = await self.rounds.next_round(self.config.register_interval_ms / 1000)
            await self.register_all()
            await self.rounds.finished(ticket)

    async def publish_topics(self) -> None:
        if not await self.rounds.publish(REGISTER_TIMEOUT_S):
            log.warning("topic change not yet published to the nameservers; retried next round")

    async def register_all(self) -> None:
        if self._stepped_aside():
            return  # its store failed: out of the routes until restarted
        if self.zk is not None:
            self.zk.refresh()
        await asyncio.gather(*(self._register(ns) for ns in self.config.nameservers))

    def _full_request(self) -> tuple[nameserver_pb2.RegisterBrokerRequest, DataVersion]:
        # The version is read before the topics: a change in between is then sent again with
        # the next delta, and applying a change twice is harmless.
        version = DataVersion(**vars(self.topics.data_version))
        info = broker_info(self.config, self.topics, self.role, version)
        request = nameserver_pb2.RegisterBrokerRequest(
            broker=info, topics=topic_protos(self.topics)
        )
        return request, version

    def _delta_request(
        self, base: DataVersion
    ) -> tuple[nameserver_pb2.RegisterBrokerRequest, DataVersion] | None:
        changes = self.topics.changes_since(base)
        if changes is None:
            return None
        version = changes.data_version
        info = broker_info(self.config, self.topics, self.role, version)
        request = nameserver_pb2.RegisterBrokerRequest(
            broker=info,
            topics=[topic_proto(t) for t in changes.upserted if not is_system_topic(t.topic)],
            delta=nameserver_pb2.TopicDelta(
                base_version=common_pb2.DataVersion(
                    state_version=base.state_version,
                    counter=base.counter,
                    timestamp_ms=base.timestamp_ms,
                ),
                removed_topics=[t for t in changes.removed if not is_system_topic(t)],
            ),
        )
        return request, version

    async def _register(self, nameserver: str) -> None:
        base = self._accepted.get(nameserver)
        prepared = None if base is None else self._delta_request(base)
        stub = nameserver_pb2_grpc.NameServerStub(self._channel(nameserver))
        try:
            if prepared is not None:
                response = await stub.RegisterBroker(prepared[0], timeout=REGISTER_TIMEOUT_S)
            if prepared is None or response.full_registration_needed:
                prepared = self._full_request()
                response = await stub.RegisterBroker(prepared[0], timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            # The nameserver may or may not have applied it: the next round's delta says which
            # version it is based on, and a nameserver that does not hold it asks for all.
            log.warning("registering with nameserver %s failed: %s", nameserver, e.details())
            held = self._channels.pop(nameserver, None)
            if held is not None:
                self._retire(held[0])
            return
        self._accepted[nameserver] = prepared[1]
        # The registry tells a slave where its master replicates from (RocketMQ's
        # RegisterBrokerResult.haServerAddr); empty while the group has no live master.
        self._on_master(response.master_address, response.master_ha_address)

    async def unregister_all(self) -> None:
        info = broker_info(self.config, self.topics, self.role)
        request = nameserver_pb2.UnregisterBrokerRequest(
            identity=info.identity, address=info.address
        )
        for ns in self.config.nameservers:
            try:
                await nameserver_pb2_grpc.NameServerStub(self._channel(ns)).UnregisterBroker(
                    request, timeout=REGISTER_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                log.warning("unregistering from nameserver %s failed: %s", ns, e.details())
