"""The broker process: opens the store, serves the Broker service, registers with nameservers
(heartbeats) and/or in ZooKeeper (an ephemeral znode, ``zk_registration``), persists consumer
offsets, and on SIGTERM stops accepting, drains, closes the store (flush, dispatch, checkpoint,
abort file removed) and unregisters."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidemq.protos import (
    broker_pb2,
    broker_pb2_grpc,
    replication_pb2_grpc,
)
from tidemq.protos.tls import add_port
from tidemq.replication.epochs import EpochFile
from tidemq.replication.slave_link import SlaveClient
from tidemq.services import tls_flags
from tidemq.services.auth.on_the_wire import wire_guard
from tidemq.services.broker import tracing
from tidemq.services.broker.admission_grpc import admission_interceptor
from tidemq.services.broker.auto_failover import AutomaticFailover
from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerConfig, BrokerRole
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.broker.daily_stats import DailyStats, DayTopic, take_sample
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.logged_services import LoggedServices
from tidemq.services.broker.long_polling import PullWaiters
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.nameserver_registration import NameserverRegistration
from tidemq.services.broker.offset_cleanup import DeletedTopicOffsets
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.periodic import every
from tidemq.services.broker.publication import RegistrationRounds
from tidemq.services.broker.receive.waiters import ReceiveWaiters
from tidemq.services.broker.replication import (
    TypedReplicationServicer,
    identity,
    report_lag,
    status_proto,
)
from tidemq.services.broker.retention import wire_archive, wire_retention_floors
from tidemq.services.broker.rocketmq.server import RocketMQListener
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.runtime_config import RuntimeConfig
from tidemq.services.broker.servicer import BrokerServicer
from tidemq.services.broker.store_failure import StepAside
from tidemq.services.broker.topics import TopicManager
from tidemq.services.broker.zk_registration import ZkRegistration
from tidemq.services.errors import add_servicer
from tidemq.storage import MessageStore, StoreConfig
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

SERVICE_NAME: str = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
HEALTH_SERVICES = ("", SERVICE_NAME)  # "" is the whole server, as probes ask by default


class Broker:
    """One running broker; ``start`` and ``stop`` are the lifecycle, both on the event loop."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.rounds = RegistrationRounds()
        self.store = MessageStore(
            StoreConfig(
                config.store_dir,
                flush_mode=config.flush,
                store_host=config.store_host(),
                archive=config.archive,
                **config.store_overrides,
            )
        )
        # Settings changed at runtime (UpdateBrokerConfig) apply before anything reads them.
        self.runtime_config = RuntimeConfig(config, self.store.config, config.store_dir)
        self.topics = TopicManager(config.store_dir, max_topics=config.max_topics)
        self.groups = SubscriptionGroupManager(config.store_dir, max_groups=config.max_groups)
        self.offsets = OffsetManager(config.store_dir)
        self.daily = DailyStats(config.store_dir, config.daily_stats_days)
        self.offset_cleanup = DeletedTopicOffsets(
            self.offsets,
            lambda: {t.topic for t in self.topics.all()},
            config.deleted_topic_offsets_grace_ms,
        )
        # Receive, transactions, the timer: state as records of logs in the CommitLog.
        self.logged = LoggedServices(config, self.store)
        wire_retention_floors(
            self.store,
            lambda: self.replication,
            self.offsets,
            receive_log=self.logged.journal.retention_position,
            pinned=self.logged.pinned(),
        )
        if config.archive is not None:
            wire_archive(
                self.store,
                lambda: self.replication,
                lambda: self.role.is_master,
                self.topics,
                f"{config.cluster}/{config.broker_name}",
            )
        if config.automatic:
            # A damaged epoch file refuses start-up here, before the store opens (StateFileError).
            EpochFile(config.store_dir)
        self.role = RoleState.for_config(
            config.role, config.broker_id, config.automatic, config.failover_lease_ms
        )
        self.failover: AutomaticFailover | None = None
        self.config_sync: ConfigSync | None = None
        if config.role is BrokerRole.SLAVE or config.automatic:
            # A slave's topics, groups and offsets are its master's (config sync).
            self.config_sync = ConfigSync(
                self.topics,
                self.groups,
                self.offsets,
                config.config_sync_interval_ms,
                config.config_full_sync_interval_ms,
                on_topics_changed=self.rounds.request,
                tls=config.client_tls,
                credentials=config.client_credentials,
                runtime=self.runtime_config,
            )
        if config.role is not BrokerRole.SLAVE:
            self.topics.set_auto_create(config.auto_create_topics, config.default_queue_nums)
        self.clients = ClientRegistry(expiry_ms=config.client_expiry_ms)
        self.server: grpc.aio.Server | None = None
        self.servicer: BrokerServicer | None = None
        self.rocketmq: RocketMQListener | None = None
        self.health: health.aio.HealthServicer | None = None
        self.replication: TypedReplicationServicer | None = None
        self.slave: SlaveClient | None = None
        self.metrics: BrokerMetrics | None = None
        self.step_aside: StepAside | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.bound_port = 0
        # Built here so a broker that could never register (a bad name) fails before serving.
        self.zk = (
            ZkRegistration.for_broker(config, self.topics, self.role) if config.zk_hosts else None
        )
        if self.zk is not None and config.role is BrokerRole.SLAVE:
            self.zk.on_master = self._master_found
        self.registration = NameserverRegistration(
            config,
            self.topics,
            self.role,
            self.rounds,
            self.zk,
            self._master_found,
            lambda: self.step_aside is not None and self.step_aside.stepped_aside,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.store.open)
        waiters = PullWaiters(loop)
        self.store.add_dispatch_listener(waiters.notify)
        receive_waiters = ReceiveWaiters(loop)
        self.store.add_dispatch_listener(receive_waiters.dispatched)
        await self.logged.open(loop)
        cfg = self.config
        if cfg.role is BrokerRole.SLAVE or cfg.automatic:
            self.slave = SlaveClient(
                self.store,
                identity(cfg),
                cfg.replication,
                address=cfg.advertised,
                tls=cfg.client_tls,
                credentials=cfg.client_credentials,
            )
        if cfg.role is not BrokerRole.SLAVE:
            self.replication = TypedReplicationServicer(self.store, identity(cfg), cfg.replication)
            if cfg.replication.confirm_offset:
                # Pulls held back by the confirm offset look again when it moves.
                self.replication.add_confirm_listener(lambda _offset: waiters.wake_all())
        if cfg.automatic:
            assert self.zk is not None  # checked with the config: auto needs ZooKeeper
            assert self.replication is not None
            assert self.slave is not None
            assert self.config_sync is not None
            zk = self.zk
            self.failover = AutomaticFailover(
                cfg,
                self.store,
                self.role,
                self.replication,
                self.slave,
                self.config_sync,
                lambda: zk.client,
                self.rounds.request,
                self.topics,
            )
        if cfg.metrics_listen:
            self.metrics = BrokerMetrics(
                cfg,
                self.store,
                self.topics,
                self.clients,
                self.offsets,
                self.groups,
                self.replication_status,
                self.role,
                self.failover.agent if self.failover is not None else None,
            )

        factories = self.logged.factories(
            store=self.store,
            groups=self.groups,
            offsets=self.offsets,
            topics=self.topics,
            receive_waiters=receive_waiters,
            publish_topics=self.registration.publish_topics,
            replication=self.replication,
            confirm_cap=self._confirm_cap,
            metrics=self.metrics,
        )
        self.servicer = BrokerServicer(
            cfg,
            self.store,
            self.topics,
            self.offsets,
            self.clients,
            waiters,
            publish_topics=self.registration.publish_topics,
            metrics=self.metrics,
            groups=self.groups,
            replication=self.replication,
            replication_status=self.replication_status,
            role=self.role,
            confirm_cap=self._confirm_cap,
            log_epoch=self.failover.log_epoch if self.failover is not None else None,
            failover=self.failover,
            receive=factories.receive,
            transactions=factories.transactions,
            timer=factories.timer,
            runtime_config=self.runtime_config,
        )
        self.servicer.broker_admin.daily = self.daily_rows
        self.logged.attach(self.servicer, self.groups, self.offsets, self.role, self.metrics)
        # gRPC's 4 MiB default would refuse an oversize body before validation could answer it
        # with a typed BODY_TOO_LARGE; batches of large bodies need room too.
        limit = self.config.max_request_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
            interceptors=[admission_interceptor(cfg, self.metrics)],
        )
        # Who may call what (docs/security.md): None without an ACL file and mutual TLS.
        self.guard = wire_guard(
            acl_path=cfg.acl_file,
            brokers_by_certificate=cfg.mutual_tls,
            max_clock_skew_ms=cfg.auth_max_clock_skew_ms,
            own_group=cfg.broker_name,
            on_refused=self.metrics.auth_refused if self.metrics is not None else None,
        )
        add_servicer(
            broker_pb2_grpc.add_BrokerServicer_to_server, self.servicer, self.server, self.guard
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.replication is not None:
            # Slaves replicate from the Broker service's own port (the advertised ha_address).
            self.replication.guard = self.guard
            add_servicer(
                replication_pb2_grpc.add_ReplicationServicer_to_server,
                self.replication,
                self.server,
                self.guard,
            )
        tls_flags.warn_if_exposed("the broker", self.config.listen, cfg.tls, cfg.acl_file)
        self.bound_port = add_port(self.server, self.config.listen, cfg.tls)
        if not self.bound_port:
            raise OSError(f"cannot listen on {self.config.listen}")
        if cfg.rocketmq_listen:
            self.rocketmq = RocketMQListener(
                cfg,
                self.servicer,
                self.topics,
                self.groups,
                self.role,
                self.store.config.max_message_body_bytes or self.config.max_request_bytes,
                self.guard,
            )
            await self.rocketmq.start()
        if self.metrics is not None:
            port = self.metrics.serve(self.config.metrics_listen)
            log.info("metrics on http://%s/metrics (port %d)", self.config.metrics_listen, port)
        # The daily statistics' baseline, before any client is served: whatever is sent from
        # now on counts (a baseline taken by the first scheduled run would swallow it).
        take_sample(self.daily, now_ms(), self.topics, self.store, self.offsets)
        await self.server.start()
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        # A failed store (the disk failed) makes the broker step aside (``store_failure``).
        self.step_aside = StepAside(
            self.health, HEALTH_SERVICES, self.registration.unregister_all, self.zk, self.failover
        )
        self.store.on_failure(self.step_aside.on_store_failure(loop))
        if self.zk is not None:
            await self.zk.start()
        if self.failover is not None:
            self.failover.start()
        self._tasks = [
            asyncio.create_task(every(self.config.offset_flush_interval_ms, self._persist)),
            asyncio.create_task(every(10_000, self._expire_clients)),
            asyncio.create_task(every(self._scheduled_period_ms(), self._scheduled)),
            asyncio.create_task(self.registration.run()),
            *(asyncio.create_task(task) for task in self.logged.tasks()),
        ]
        if self.failover is None and self.slave is not None:
            self._tasks.append(asyncio.create_task(self.slave.run()))
        if self.failover is None and self.config_sync is not None:
            self._tasks.append(asyncio.create_task(self.config_sync.run()))
        if self.replication is not None:
            self._tasks.append(
                asyncio.create_task(
                    every(self.config.replication.lag_report_interval_ms, self._report_lag)
                )
            )
        log.info(
            "broker %s/%d serving on %s (store %s)",
            self.config.broker_name,
            self.config.broker_id,
            self.config.listen,
            self.config.store_dir,
        )

    def replication_status(self) -> object:
        return status_proto(self.config, self.replication, self.slave, self.config_sync)

    async def _report_lag(self) -> None:
        if self.replication is not None and self.role.is_master:
            report_lag(self.config, self.replication)

    def _confirm_cap(self) -> int | None:
        """Under confirm_offset: the highest CommitLog offset consumers of this broker see."""
        if self.failover is not None:
            return self.failover.confirm_cap()
        if self.replication is not None:
            return self.replication.confirmed_offset
        return self.slave.confirm_offset if self.slave is not None else None

    async def _persist(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.offsets.persist)

    def _scheduled_period_ms(self) -> int:
        # Every minute, or more often when the grace is short (tests), never below a second.
        return min(60_000, max(1_000, self.config.deleted_topic_offsets_grace_ms // 2))

    async def _scheduled(self) -> None:
        """RocketMQ's broker scheduler: the day's statistics, and deleted topics' offsets."""
        now = now_ms()
        take_sample(self.daily, now, self.topics, self.store, self.offsets)
        self.offset_cleanup.scan(now)
        await asyncio.get_running_loop().run_in_executor(None, self.daily.persist)

    def daily_rows(self, days: int) -> list[DayTopic]:
        """The last ``days`` days' statistics, counted up to now."""
        take_sample(self.daily, now_ms(), self.topics, self.store, self.offsets)
        return self.daily.rows(days)

    async def _expire_clients(self) -> None:
        gone = self.clients.expire(now_ms())
        if self.rocketmq is not None:
            gone += self.rocketmq.expire(now_ms())
        if gone:
            log.info("clients expired: %s", gone)

    def _master_found(self, address: str, ha_address: str) -> None:
        """Where the group's master is, from a nameserver's answer or its ZooKeeper znode."""
        if self.slave is not None:
            self.slave.set_master(ha_address)
        if self.config_sync is not None:
            self.config_sync.set_master(address)

    async def stop(self) -> None:
        """Graceful: refuse new work, let calls in flight finish, then close the store cleanly."""
        if self.health is not None:
            # NOT_SERVING first, so probes and load balancers move away before the port closes.
            await self.health.enter_graceful_shutdown()
        if self.servicer is not None:
            self.servicer.stop_accepting()
        if self.rocketmq is not None:
            self.rocketmq.stop_accepting()
        if self.failover is not None:
            # Before the ZooKeeper session closes: a master stops acknowledging first.
            await self.failover.stop()
        if self.zk is not None:
            # Out of the routes before draining: new requests are refused from here on anyway.
            await self.zk.stop()
        if self.replication is not None:
            self.replication.close()
        for t in self._tasks:
            t.cancel()
        # The slave's link appends to the store: it must be gone before the store closes.
        while True:
            _, pending = await asyncio.wait(self._tasks, timeout=5)
            if not pending:
                break
            for t in pending:
                log.warning("stopping: still waiting for %s: %s", t.get_name(), t.get_stack())
        grace_s = self.config.shutdown_grace_ms / 1000
        if self.rocketmq is not None:
            await self.rocketmq.stop(grace_s)
        if self.server is not None:
            await self.server.stop(grace_s)
        await self.registration.unregister_all()
        await self.registration.close()
        loop = asyncio.get_running_loop()
        if self.metrics is not None:
            # Before the store closes: a scrape reads the store.
            await loop.run_in_executor(None, self.metrics.stop)
        await loop.run_in_executor(None, self.offsets.persist)
        await self.logged.close()
        await loop.run_in_executor(None, self.store.close)
        log.info("broker %s stopped cleanly", self.config.broker_name)


async def serve(config: BrokerConfig) -> None:
    tracing.setup(config.otel)
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
    # What start-up built lives as long as the broker: out of the collector's sight, a full
    # collection no longer walks it (under load that took 10-30 ms, every call waiting).
    gc.freeze()
    print(f"tidemq broker {config.broker_name} listening on {config.listen}", flush=True)
    if config.rocketmq_listen:
        print(f"RocketMQ 5 protocol (official clients) on {config.rocketmq_listen}", flush=True)
    await stop.wait()
    await broker.stop()
