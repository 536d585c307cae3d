"""The broker's RocketMQ 5 listener (``--rocketmq-listen``): its own gRPC server on the broker's
event loop, serving ``apache.rocketmq.v2.MessagingService`` over the broker's handlers, started
and stopped with the broker."""

from __future__ import annotations

import logging

import grpc

from tidemq.protos import nameserver_pb2
from tidemq.protos.rocketmq import service_pb2_grpc
from tidemq.protos.tls import add_port
from tidemq.services import tls_flags
from tidemq.services.auth.on_the_wire import WireGuard
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.groups import GroupSettings, SubscriptionGroupManager
from tidemq.services.broker.rocketmq.clients import V2Clients
from tidemq.services.broker.rocketmq.routes import RouteSource
from tidemq.services.broker.rocketmq.servicer import MessagingServicer
from tidemq.services.broker.rocketmq.settings import BrokerLimits
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.servicer import BrokerServicer
from tidemq.services.broker.topics import TopicManager
from tidemq.services.errors import add_servicer
from tidemq.services.nameserver.zk_registry import ZooKeeperRegistry, ZooKeeperRegistryConfig

log = logging.getLogger(__name__)


class RocketMQListener:
    def __init__(
        self,
        config: BrokerConfig,
        broker: BrokerServicer,
        topics: TopicManager,
        groups: SubscriptionGroupManager,
        role: RoleState,
        max_body_bytes: int,
        guard: WireGuard | None = None,
    ) -> None:
        self.config = config
        self.clients = V2Clients(expiry_ms=config.client_expiry_ms)

        def own_route(topic: str) -> nameserver_pb2.QueryRouteResponse | None:
            cfg = topics.get(topic)
            if cfg is None:
                return None
            return nameserver_pb2.QueryRouteResponse(
                topic=topic,
                queues=[
                    nameserver_pb2.QueueData(
                        broker_name=config.broker_name,
                        read_queue_nums=cfg.read_queue_nums,
                        write_queue_nums=cfg.write_queue_nums,
                        perm=cfg.perm,
                    )
                ],
                brokers=[
                    nameserver_pb2.BrokerData(
                        cluster=config.cluster,
                        broker_name=config.broker_name,
                        rocketmq_addresses={role.registered_id: config.rocketmq_advertised},
                    )
                ],
            )

        # With ZooKeeper and no nameserver (the Helm chart's brokers), routes are read from
        # ZooKeeper as the nameservers read them.
        zookeeper = (
            ZooKeeperRegistry(
                ZooKeeperRegistryConfig(
                    config.zk_hosts, config.zk_root, config.zk_session_timeout_ms
                )
            )
            if config.zk_hosts and not config.nameservers
            else None
        )
        self.routes = RouteSource(
            config.nameservers, own_route, zookeeper, config.client_tls, config.client_credentials
        )

        def group_settings(group: str) -> GroupSettings | None:
            found = groups.get(group)
            return found.settings if found is not None else None

        self.servicer = MessagingServicer(
            broker,
            self.clients,
            self.routes,
            BrokerLimits(max_body_bytes=max_body_bytes),
            group_settings,
        )
        # Above the body limit: a body at the limit plus its headers must reach validation.
        limit = config.max_request_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ]
        )
        add_servicer(
            service_pb2_grpc.add_MessagingServiceServicer_to_server,
            self.servicer,
            self.server,
            guard,
        )
        self.bound_port = 0

    async def start(self) -> None:
        tls = self.config.tls
        tls_flags.warn_if_exposed(
            "the RocketMQ 5 listener", self.config.rocketmq_listen, tls, self.config.acl_file
        )
        self.bound_port = add_port(self.server, self.config.rocketmq_listen, tls)
        if not self.bound_port:
            raise OSError(f"cannot listen on {self.config.rocketmq_listen}")
        await self.routes.start()
        await self.server.start()
        log.info(
            "RocketMQ 5 protocol (apache.rocketmq.v2) on %s, advertised as %s",
            self.config.rocketmq_listen,
            self.config.rocketmq_advertised,
        )

    def stop_accepting(self) -> None:
        """Telemetry streams end; calls in flight finish in ``stop``'s grace."""
        self.servicer.stop()

    async def stop(self, grace_s: float) -> None:
        await self.server.stop(grace_s)
        await self.servicer.close()
        await self.routes.stop()

    def expire(self, now_ms: int) -> list[str]:
        return self.clients.expire(now_ms)
