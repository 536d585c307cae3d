"""The Broker gRPC service: decode, validate, call the store or a state table, encode.

Every handler fails through ``abort_with``, so a bad request gets a typed status and never an
opaque UNKNOWN, and never changes anything before it is fully validated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2
from tidemq.replication.transport import ReplicationServicer
from tidemq.services.broker import config_sync
from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerConfig, BrokerRole
from tidemq.services.broker.convert import (
    SEND_STATUS,
    parse_tag_expression,
    to_proto,
    to_store_message,
)
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.long_polling import PullWaiters
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import PERM_READ, PERM_RW, PERM_WRITE, TopicConfig, TopicManager
from tidemq.services.errors import ServiceError, abort_with, invalid, not_found, to_service_error
from tidemq.storage import MessageStore, PutStatus
from tidemq.storage.clock import monotonic_ms, now_ms
from tidemq.storage.config import parse_host
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError, StoreError

log = logging.getLogger(__name__)

R = TypeVar("R")
Handler = Callable[..., Awaitable[R]]

MAX_PULL_MESSAGES = 1024
DEFAULT_PULL_MESSAGES = 32
DEFAULT_PULL_BYTES = 4 << 20


def typed_errors(fn: Handler[R]) -> Handler[R]:
    """Any exception a handler raises becomes a typed status (unknown ones: INTERNAL, logged)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        metrics: BrokerMetrics | None = self.metrics
        try:
            response = await fn(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as e:
            if not isinstance(e, ServiceError | StoreError):  # typed errors are answers, not bugs
                log.exception("%s failed", fn.__name__)
            err = to_service_error(e)
            if metrics is not None:
                metrics.rpc(fn.__name__, common_pb2.ErrorCode.Name(err.code))
            await abort_with(context, err)
        if metrics is not None:
            metrics.rpc(fn.__name__, "OK")
        return response

    return wrapper


class FailoverControl(Protocol):
    """Automatic failover as the Broker service exposes it."""

    def status(self) -> Any: ...

    async def switchover(self, target_broker_id: int) -> Any: ...


class BrokerServicer(broker_pb2_grpc.BrokerServicer):  # type: ignore[misc]
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicManager,
        offsets: OffsetManager,
        clients: ClientRegistry,
        waiters: PullWaiters,
        publish_topics: Callable[[], Awaitable[None]],
        groups: SubscriptionGroupManager,
        metrics: BrokerMetrics | None = None,
        replication: ReplicationServicer | None = None,
        replication_status: Callable[[], Any] | None = None,
        role: RoleState | None = None,
        confirm_cap: Callable[[], int | None] | None = None,
        failover: FailoverControl | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.waiters = waiters
        self.publish_topics = publish_topics
        self.metrics = metrics
        self.groups = groups
        self.replication = replication
        self.replication_status = replication_status
        self.shutting_down = False
        self.role = role or RoleState.for_config(config.role, config.broker_id, False, 0)
        # Under confirm_offset, pulls see only what in-sync slaves hold.
        self._confirm_cap = confirm_cap if config.replication.confirm_offset else None
        self.failover = failover

    # ------------------------------------------------------------------ helpers
    async def _writable_topic(self, name: str) -> TopicConfig:
        if self.topics.get(name) is None and self.config.auto_create_topics:
            n = self.config.default_queue_nums
            try:
                self.topics.upsert(TopicConfig(name, n, n))
            except ValueError as e:
                raise invalid(str(e), common_pb2.INVALID_TOPIC) from None
            # Answer once the route exists: a consumer started right after this send must
            # find the topic at the nameserver.
            await self.publish_topics()
        return self._topic(name, for_write=True)

    def _topic(self, name: str, *, for_write: bool) -> TopicConfig:
        cfg = self.topics.get(name)
        if cfg is None:
            raise not_found(
                f"topic {name!r} does not exist on this broker", common_pb2.TOPIC_NOT_FOUND
            )
        need = PERM_WRITE if for_write else PERM_READ
        if not cfg.perm & need:
            raise ServiceError(
                grpc.StatusCode.PERMISSION_DENIED,
                common_pb2.NO_PERMISSION,
                f"topic {name!r} is not {'writable' if for_write else 'readable'} here",
            )
        return cfg

    def _check_queue(self, cfg: TopicConfig, queue_id: int, *, for_write: bool) -> None:
        limit = cfg.write_queue_nums if for_write else cfg.read_queue_nums
        if not 0 <= queue_id < limit:
            raise invalid(
                f"queue {queue_id} of {cfg.topic!r} does not exist (0..{limit - 1})",
                common_pb2.INVALID_QUEUE_ID,
            )

    def _ensure_master(self, what: str) -> None:
        if not self.role.is_master:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.NOT_MASTER,
                f"this broker is a slave; {what} on the master of its group",
                retriable=True,
            )

    async def _ensure_acknowledging(self, request_epoch: int) -> None:
        """Under automatic failover: refuse a send this broker could not acknowledge (it has
        been superseded, or its lease lapsed); a new master waits out its predecessor's lease
        (at most one lease) rather than refuse."""
        role = self.role
        if not role.automatic:
            return
        if request_epoch > role.epoch:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.STALE_EPOCH,
                f"this broker serves epoch {role.epoch}; the route names epoch {request_epoch}",
                retriable=True,
            )
        wait_ms = role.ack_from_ms - monotonic_ms()
        if role.is_master and 0 < wait_ms <= role.lease_ms:
            await asyncio.sleep(wait_ms / 1000)
        self._check_lease()

    def _check_lease(self) -> None:
        if not self.role.may_acknowledge():
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.NOT_MASTER,
                f"broker {self.config.broker_name}/{self.role.own_id} cannot acknowledge "
                f"writes now (not the master, or its ZooKeeper lease lapsed); the group's "
                f"master is in the routes",
                retriable=True,
            )

    def _ensure_running(self) -> None:
        if self.shutting_down:
            raise ServiceError(
                grpc.StatusCode.UNAVAILABLE,
                common_pb2.SHUTTING_DOWN,
                "broker is shutting down",
                retriable=True,
            )

    # ------------------------------------------------------------------ send
    @typed_errors
    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.monotonic()
        self._ensure_running()
        self._ensure_master("send")
        await self._ensure_acknowledging(request.epoch)
        if not request.messages:
            raise invalid("a send carries at least one message")
        if len(request.messages) > self.config.max_batch_messages:
            raise invalid(f"at most {self.config.max_batch_messages} messages per send")
        born = _peer_host(context.peer())
        batch = []
        configs: dict[str, TopicConfig] = {}  # a batch is usually one topic: look it up once
        for m in request.messages:
            name = m.topic
            cfg = configs.get(name)
            if cfg is None:
                cfg = configs[name] = await self._writable_topic(name)
            self._check_queue(cfg, m.queue_id, for_write=True)
            batch.append(to_store_message(m, born))
        put = self.store.put_messages(batch)
        repl = self.replication
        if repl is not None:
            repl.notify_appended()
        durable = put.durable
        if self.role.role is BrokerRole.SYNC_MASTER and repl is not None:
            last = put.results[-1]
            # Flush and replication run side by side; a replication failure is what the client
            # hears, as in RocketMQ (FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE over a disk one).
            replicated = repl.replicate(last.phy_offset + last.size)
            if durable.done():
                flushed, status = durable.result(), await replicated
            else:
                flushed, status = await asyncio.gather(asyncio.wrap_future(durable), replicated)
            if status is PutStatus.PUT_OK:
                status = flushed
        else:
            status = durable.result() if durable.done() else await asyncio.wrap_future(durable)
        # Checked again at the answer: a lease that lapsed while the send waited for the disk
        # or the slaves means another broker may be master by now.
        self._check_lease()
        wire = SEND_STATUS[status]
        if self.metrics is not None:
            self.metrics.sent(batch, broker_pb2.SendStatus.Name(wire), started)
        response = broker_pb2.SendMessageResponse(
            broker_name=self.config.broker_name, epoch=self.role.epoch
        )
        add = response.results.add  # built in place: a list of SendResults would be copied
        for r, m in zip(put.results, batch, strict=True):
            add(
                status=wire,
                msg_id=r.msg_id,
                queue_id=m.queue_id,
                queue_offset=r.queue_offset,
                commitlog_offset=r.phy_offset,
            )
        return response

    # ------------------------------------------------------------------ pull
    @typed_errors
    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = await self._pull(request)
        if self.metrics is not None:
            self.metrics.pulled(
                request.topic,
                broker_pb2.PullStatus.Name(response.status),
                len(response.messages),
                sum(m.size for m in response.messages),
            )
        return response

    async def _pull(self, request: Any) -> Any:
        self._ensure_running()
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative")
        if request.max_messages < 0 or request.max_bytes < 0 or request.long_poll_timeout_ms < 0:
            raise invalid("max_messages, max_bytes and long_poll_timeout_ms must be >= 0")
        cfg = self._topic(request.topic, for_write=False)
        self._check_queue(cfg, request.queue_id, for_write=False)
        tags = parse_tag_expression(request.tag_expression)
        max_n = min(request.max_messages or DEFAULT_PULL_MESSAGES, MAX_PULL_MESSAGES)
        max_bytes = request.max_bytes or DEFAULT_PULL_BYTES
        wait_ms = min(request.long_poll_timeout_ms, self.config.long_poll_max_ms)
        deadline = time.monotonic() + wait_ms / 1000
        topic, qid = request.topic, request.queue_id
        while True:
            woken = self.waiters.register(topic, qid)
            try:
                cap = self._confirm_cap() if self._confirm_cap is not None else None
                got = self.store.get_messages(
                    topic, qid, request.offset, max_n, max_bytes, tags, max_commitlog_offset=cap
                )
            except OffsetBelowMinError as e:
                return broker_pb2.PullMessageResponse(
                    status=broker_pb2.OFFSET_TOO_SMALL,
                    next_offset=e.min_offset,
                    min_offset=e.min_offset,
                    max_offset=self.store.max_offset(topic, qid),
                )
            except OffsetBeyondMaxError as e:
                return broker_pb2.PullMessageResponse(
                    status=broker_pb2.OFFSET_OVERFLOW,
                    next_offset=e.max_offset,
                    min_offset=self.store.min_offset(topic, qid),
                    max_offset=e.max_offset,
                )
            if got.messages or got.next_offset > request.offset:
                status = broker_pb2.FOUND if got.messages else broker_pb2.NO_MATCHED_MESSAGE
                return broker_pb2.PullMessageResponse(
                    status=status,
                    messages=[to_proto(m) for m in got.messages],
                    next_offset=got.next_offset,
                    min_offset=got.min_offset,
                    max_offset=got.max_offset,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.shutting_down:
                return broker_pb2.PullMessageResponse(
                    status=broker_pb2.NO_NEW_MESSAGE,
                    next_offset=request.offset,
                    min_offset=got.min_offset,
                    max_offset=got.max_offset,
                )
            metrics = self.metrics
            waiting = metrics.long_poll() if metrics is not None else contextlib.nullcontext()
            with waiting, contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await woken.wait()

    # ------------------------------------------------------------------ lookups
    @typed_errors
    async def QueryMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._topic(request.topic, for_write=False)
        if not request.key:
            raise invalid("key is required")
        if request.max_messages < 0:
            raise invalid(f"max_messages {request.max_messages} is negative")
        end = request.end_timestamp_ms or 2**63 - 1
        found = self.store.query_by_key(
            request.topic,
            request.key,
            request.begin_timestamp_ms,
            end,
            request.max_messages or 32,
        )
        return broker_pb2.QueryMessageResponse(messages=[to_proto(m) for m in found])

    @typed_errors
    async def ViewMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return broker_pb2.ViewMessageResponse(
            message=to_proto(self.store.get_message_by_id(request.msg_id))
        )

    @typed_errors
    async def GetQueueOffsets(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cfg = self._topic(request.topic, for_write=False)
        ids = list(request.queue_ids) or list(range(cfg.read_queue_nums))
        for q in ids:
            self._check_queue(cfg, q, for_write=False)
        return broker_pb2.GetQueueOffsetsResponse(
            queues=[
                broker_pb2.QueueOffsets(
                    queue_id=q,
                    min_offset=self.store.min_offset(cfg.topic, q),
                    max_offset=self.store.max_offset(cfg.topic, q),
                )
                for q in ids
            ]
        )

    @typed_errors
    async def SearchOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cfg = self._topic(request.topic, for_write=False)
        self._check_queue(cfg, request.queue_id, for_write=False)
        return broker_pb2.SearchOffsetResponse(
            offset=self.store.offset_by_time(cfg.topic, request.queue_id, request.timestamp_ms)
        )

    # ------------------------------------------------------------------ clients and offsets
    @typed_errors
    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.client_id:
            raise invalid("client_id is required")
        now = now_ms()
        memberships = []  # all validated before any is recorded
        for c in request.consumers:
            if not c.group:
                raise invalid("consumer group name is required")
            subs = {s.topic: s.tag_expression or "*" for s in c.subscriptions}
            for expr in subs.values():
                parse_tag_expression(expr)
            memberships.append((c, subs))
        for c, subs in memberships:
            self.clients.heartbeat(request.client_id, c.group, c.mode, subs, now)
            if self.role.is_master and self.groups.observe(c.group, c.mode, subs, now):
                log.info("subscription group %s: mode %d, topics %s", c.group, c.mode, list(subs))
        return broker_pb2.HeartbeatResponse()

    @typed_errors
    async def UnregisterClient(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.clients.unregister(request.client_id)
        return broker_pb2.UnregisterClientResponse()

    @typed_errors
    async def GetConsumerList(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        return broker_pb2.GetConsumerListResponse(
            client_ids=self.clients.members(request.group, now_ms())
        )

    @typed_errors
    async def CommitOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative")
        cfg = self._topic(request.topic, for_write=False)
        self._check_queue(cfg, request.queue_id, for_write=False)
        offset = self.offsets.commit(
            request.group,
            request.topic,
            request.queue_id,
            request.offset,
            now_ms(),
            reset=request.reset,
        )
        return broker_pb2.CommitOffsetResponse(offset=offset)

    @typed_errors
    async def QueryConsumerOffset(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.group:
            raise invalid("group is required")
        offset = self.offsets.query(request.group, request.topic, request.queue_id)
        return broker_pb2.QueryConsumerOffsetResponse(found=offset is not None, offset=offset or 0)

    # ------------------------------------------------------------------ topics
    @typed_errors
    async def CreateTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._ensure_master("create topics")
        t = request.topic
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
        self._ensure_master("delete topics")
        if not self.topics.delete(request.topic):
            raise not_found(f"topic {request.topic!r} does not exist", common_pb2.TOPIC_NOT_FOUND)
        await self.publish_topics()
        return broker_pb2.DeleteTopicResponse()

    @typed_errors
    async def ListTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return broker_pb2.ListTopicsResponse(topics=[topic_proto(t) for t in self.topics.all()])

    @typed_errors
    async def GetBrokerStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        st = self.store.stats()
        return broker_pb2.GetBrokerStatusResponse(
            broker=broker_info(self.config, self.topics, self.role),
            store=broker_pb2.StoreStatus(
                commitlog_min_offset=st.commitlog_min_offset,
                commitlog_max_offset=st.commitlog_max_offset,
                flushed_offset=st.flushed_offset,
                dispatched_offset=st.dispatched_offset,
                disk_usage_ratio=st.disk_usage_ratio,
                writable=st.writable,
            ),
            running=not self.shutting_down,
            replication=self.replication_status() if self.replication_status else None,
            failover=self.failover.status() if self.failover is not None else None,
        )

    @typed_errors
    async def Switchover(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if self.failover is None:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                common_pb2.INVALID_ARGUMENT,
                "this broker runs classic master/slave (failover classic): no switchover",
                retriable=False,
            )
        if request.broker_name and request.broker_name != self.config.broker_name:
            raise invalid(
                f"this broker is in group {self.config.broker_name!r}, not {request.broker_name!r}"
            )
        self._ensure_master("switch over")
        return await self.failover.switchover(request.target_broker_id)

    @typed_errors
    async def SyncConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return config_sync.answer(request, self.topics, self.groups, self.offsets, topic_proto)


def topic_proto(t: TopicConfig) -> Any:
    return common_pb2.TopicConfig(
        topic=t.topic,
        read_queue_nums=t.read_queue_nums,
        write_queue_nums=t.write_queue_nums,
        perm=t.perm,
        order=t.order,
        attributes=t.attributes,
    )


def topic_protos(topics: TopicManager) -> list[Any]:
    return [topic_proto(t) for t in topics.all()]


def broker_info(config: BrokerConfig, topics: TopicManager, role: RoleState) -> Any:
    dv = topics.data_version
    return common_pb2.BrokerInfo(
        identity=common_pb2.BrokerIdentity(
            cluster=config.cluster, broker_name=config.broker_name, broker_id=role.registered_id
        ),
        address=config.advertised,
        # Masters serve replication on the Broker service's own port; slaves serve none.
        ha_address=config.advertised if role.is_master else "",
        role=common_pb2.BrokerRole.Value(role.role.value),
        epoch=role.epoch,
        data_version=common_pb2.DataVersion(
            state_version=dv.state_version, counter=dv.counter, timestamp_ms=dv.timestamp_ms
        ),
    )


def _peer_host(peer: str) -> tuple[bytes, int]:
    """gRPC peer strings look like "ipv4:127.0.0.1:5555" or "ipv6:[::1]:5555"."""
    _, _, rest = peer.partition(":")
    try:
        return parse_host(rest)
    except Exception:  # noqa: BLE001 - a peer we cannot parse (unix socket) is recorded as 0.0.0.0
        return (bytes(4), 0)
