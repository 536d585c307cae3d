"""Topic administration: create (or update), delete and list this broker's topics; a change is
published to the registry before it is answered. The broker's own log topics (%SYS%) are not
listed, created or deleted here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.services.broker.convert import topic_proto, topic_protos
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.receive.dead_letter import is_system_topic
from tidemq.services.broker.topics import PERM_RW, TopicConfig
from tidemq.services.errors import invalid, not_found, system_topic


class TopicAdminHandlers:
    def __init__(
        self,
        checks: BrokerChecks,
        publish_topics: Callable[[], Awaitable[None]],
        metrics: BrokerMetrics | None,
    ) -> None:
        self.checks = checks
        self.config = checks.config
        self.topics = checks.topics
        self.publish_topics = publish_topics
        self.metrics = metrics

    @typed_errors
    async def CreateTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.checks.ensure_master("create topics")
        t = request.topic
        if is_system_topic(t.topic):
            raise system_topic(t.topic, "create")
        cfg = TopicConfig(
            topic=t.topic,
            read_queue_nums=t.read_queue_nums or self.config.default_queue_nums,
            write_queue_nums=t.write_queue_nums or self.config.default_queue_nums,
            perm=t.perm or PERM_RW,
            order=t.order,
            attributes=dict(t.attributes),
        )
        try:
            created = self.topics.upsert(cfg)
        except ValueError as e:
            raise invalid(str(e), common_pb2.INVALID_TOPIC) from None
        await self.publish_topics()
        return broker_pb2.CreateTopicResponse(topic=topic_proto(cfg), created=created)

    @typed_errors
    async def DeleteTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.checks.ensure_master("delete topics")
        if is_system_topic(request.topic):
            raise system_topic(request.topic, "delete")
        if not self.topics.delete(request.topic):
            raise not_found(f"topic {request.topic!r} does not exist", common_pb2.TOPIC_NOT_FOUND)
        await self.publish_topics()
        return broker_pb2.DeleteTopicResponse()

    @typed_errors
    async def ListTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return broker_pb2.ListTopicsResponse(topics=topic_protos(self.topics))
