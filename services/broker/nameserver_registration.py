"""The broker's registration with its nameservers: a round every ``register_interval_ms`` (or
sooner when a topic change asks for one, ``publication``), each registering with every
nameserver at once; the answer says where the group's master is. On stop, unregistering."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.protos.tls import aio_channel
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.convert import broker_info, topic_protos
from tidemq.services.broker.publication import RegistrationRounds
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.broker.zk_registration import ZkRegistration

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 5.0


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
        request = nameserver_pb2.RegisterBrokerRequest(
            broker=broker_info(self.config, self.topics, self.role),
            topics=topic_protos(self.topics),
        )
        await asyncio.gather(*(self._register(ns, request) for ns in self.config.nameservers))

    async def _register(self, nameserver: str, request: object) -> None:
        try:
            async with aio_channel(
                nameserver, self.config.client_tls, credentials=self.config.client_credentials
            ) as channel:
                stub = nameserver_pb2_grpc.NameServerStub(channel)
                response = await stub.RegisterBroker(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.warning("registering with nameserver %s failed: %s", nameserver, e.details())
            return
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
                async with aio_channel(
                    ns, self.config.client_tls, credentials=self.config.client_credentials
                ) as channel:
                    await nameserver_pb2_grpc.NameServerStub(channel).UnregisterBroker(
                        request, timeout=REGISTER_TIMEOUT_S
                    )
            except grpc.aio.AioRpcError as e:
                log.warning("unregistering from nameserver %s failed: %s", ns, e.details())
