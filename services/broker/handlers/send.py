"""SendMessage: validate a batch, store it, wait for what its durability needs, answer.

The waits (the disk flush and, for a SYNC_MASTER, the slaves) are ``put_waits``'; what they add
up to is ``durability``'s decision.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.master_link import ReplicationServicer
from tidemq.services.broker.admission_grpc import work_done
from tidemq.services.broker.convert import SEND_STATUS, peer_host, to_store_message
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.handlers.send_blocks import BlockSends
from tidemq.services.broker.idempotence.sends import IdempotentSends
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.receive.dead_letter import client_may_send
from tidemq.services.broker.timer.scheduling import Scheduling
from tidemq.services.broker.topics import TopicConfig
from tidemq.services.broker.tracing import traced_store
from tidemq.services.broker.transactions.service import TransactionService
from tidemq.services.errors import invalid, system_topic
from tidemq.storage import MessageStore
from tidemq.storage.clock import now_ms


class SendHandler:
    def __init__(
        self,
        checks: BrokerChecks,
        store: MessageStore,
        publish_topics: Callable[[], Awaitable[None]],
        replication: ReplicationServicer | None,
        metrics: BrokerMetrics | None,
        transactions: TransactionService | None = None,
        timer: Scheduling | None = None,
    ) -> None:
        self.checks = checks
        self.config = checks.config
        self.topics = checks.topics
        self.role = checks.role
        self.store = store
        self.publish_topics = publish_topics
        self.replication = replication
        self.metrics = metrics
        self.transactions = transactions
        self.timer = timer
        self.idempotence = IdempotentSends(
            store, self.config.idempotence_max_producers, self.config.store_dir
        )
        self.blocks = BlockSends(
            checks, store, self.writable_topic, replication, metrics, self.idempotence
        )

    @typed_errors
    @traced_store
    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.monotonic()
        checks = self.checks
        checks.ensure_running()
        checks.ensure_master("send")
        await checks.ensure_acknowledging(request.epoch)
        if request.blocks:
            return await self.blocks.send(request, context, started)
        if not request.messages:
            raise invalid("a send carries at least one message")
        if len(request.messages) > self.config.max_batch_messages:
            raise invalid(f"at most {self.config.max_batch_messages} messages per send")
        born = peer_host(context.peer())
        batch = []
        configs: dict[str, TopicConfig] = {}  # a batch is usually one topic: look it up once
        for m in request.messages:
            name = m.topic
            cfg = configs.get(name)
            if cfg is None:
                cfg = configs[name] = await self.writable_topic(name)
            checks.check_queue(cfg, m.queue_id, for_write=True)
            batch.append(to_store_message(m, born))
        if request.transactional and any(
            m.deliver_at_ms or m.delay_ms or m.delay_level for m in request.messages
        ):
            # RocketMQ 5 too: a message is of one type (normal, FIFO, delay, transaction).
            raise invalid("a transactional message cannot be delayed as well")
        # Idempotent sends: what to store, what is a duplicate. Nothing may await from here
        # to the put.
        batch, idempotent = await self.idempotence.before_put(request, batch)
        wire_kept = idempotent.stored_wire(request.messages) if idempotent else request.messages
        timer = self.timer
        delayed = None
        if request.transactional:
            batch = self._transactions().halves_of(request, batch)
        elif timer is not None and batch:
            delayed = timer.prepare(wire_kept, batch, now_ms())
        put_batch = self.idempotence.stamp(idempotent, batch)
        put = self.store.put_messages(put_batch) if batch else None
        # From here on put.results is in the batch's order again.
        self.idempotence.after_put(idempotent, put_batch, put)
        if timer is not None and delayed and put is not None:
            timer.stored(delayed, put)
        work_done()  # what is left is waiting: the connection may run its next request
        # The lease is checked again at the answer, after the waits (``answer_status``).
        status = await self.idempotence.answer_status(put, self.replication, checks)
        wire = SEND_STATUS[status]
        if self.metrics is not None:
            self.metrics.sent(batch, broker_pb2.SendStatus.Name(wire), started)
        response = broker_pb2.SendMessageResponse(
            broker_name=self.config.broker_name, epoch=self.role.epoch
        )
        add = response.results.add  # built in place: a list of SendResults would be copied
        for r, m in zip(put.results if put else (), batch, strict=True):
            add(
                status=wire,
                msg_id=r.msg_id,
                queue_id=m.queue_id,
                queue_offset=r.queue_offset,
                commitlog_offset=r.phy_offset,
            )
        if request.transactional:
            self._transactions().fill_results(request, response, batch)
        if timer is not None and delayed and put is not None:
            timer.fill(delayed, response.results, put.results)
        # Last: it puts the duplicates' answers among the stored messages' ones.
        self.idempotence.fill(idempotent, response, wire)
        return response

    def _transactions(self) -> TransactionService:
        if self.transactions is None:
            raise invalid("this broker does not take transactional sends")
        return self.transactions

    async def writable_topic(self, name: str) -> TopicConfig:
        if not client_may_send(name):
            raise system_topic(name)
        if self.topics.get(name) is None and self.config.auto_create_topics:
            n = self.config.default_queue_nums
            try:
                self.topics.upsert(TopicConfig(name, n, n))
            except ValueError as e:
                raise invalid(str(e), common_pb2.INVALID_TOPIC) from None
            # Answer once the route exists: a consumer started right after this send must
            # find the topic at the nameserver.
            await self.publish_topics()
        return self.checks.topic(name, for_write=True)
