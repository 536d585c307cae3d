"""Registry backends: where a nameserver's routes come from.

The servicer talks only to ``Registry``. ``EmbeddedRegistry`` (the default, no ZooKeeper) keeps a
``RouteTable`` fed by RegisterBroker heartbeats and expires silent brokers, as a RocketMQ
nameserver does. ``zk_registry.ZooKeeperRegistry`` (brokers own ephemeral znodes, nameservers
watch them) implements the same Protocol; that is why every method is async even though the
embedded one never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    ClusterInfo,
    MasterAddresses,
    RegistrationRejected,
    TopicRoute,
)
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

# A full registration at least this large makes the nameserver freeze what is alive (see
# ``EmbeddedRegistry.register``); smaller ones are not worth a pass over the heap.
FREEZE_AFTER_TOPICS = 10_000


@dataclass(frozen=True)
class RegistryStatus:
    registry: str  # "embedded" or "zookeeper"
    stale: bool  # True when the backend is unreachable and routes are the last known ones
    last_update_ms: int  # wall-clock time of the latest change seen; 0 before any
    brokers: int
    detail: str


class RegistryUnavailableError(Exception):
    """The registry has no routes to answer with: its backend has not been read since start.

    Retriable: another nameserver, or this one a little later, can answer.
    """


class HeartbeatsRefusedError(RegistrationRejected):
    """A RegisterBroker heartbeat to a nameserver whose brokers register elsewhere (ZooKeeper)."""


class Registry(Protocol):
    """What a nameserver needs from its backend.

    Errors: ``route_table.RegistrationRejected`` (and its subclasses) from ``register``;
    ``RegistryUnavailableError`` from ``route`` and ``cluster_info``.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def register(self, reg: BrokerRegistration) -> MasterAddresses: ...

    async def unregister(
        self, cluster: str, broker_name: str, broker_id: int, address: str
    ) -> bool: ...

    async def route(self, topic: str) -> TopicRoute | None: ...

    async def cluster_info(self) -> list[ClusterInfo]: ...

    async def topic_count(self) -> int: ...

    async def status(self) -> RegistryStatus: ...


@dataclass(frozen=True)
class EmbeddedRegistryConfig:
    """RocketMQ's defaults: scanNotActiveBrokerInterval 5 s, broker channel expiry 120 s."""

    broker_expiry_ms: int = 120_000
    scan_interval_ms: int = 5_000

    def __post_init__(self) -> None:
        if self.broker_expiry_ms <= 0:
            raise ValueError(f"broker_expiry_ms must be positive, got {self.broker_expiry_ms}")
        if self.scan_interval_ms <= 0:
            raise ValueError(f"scan_interval_ms must be positive, got {self.scan_interval_ms}")


class EmbeddedRegistry:
    """A RouteTable in this process, plus the task that expires silent brokers.

    Everything runs on one asyncio loop and the table never awaits, so each call sees and leaves
    the table consistent without a lock.
    """

    def __init__(
        self,
        config: EmbeddedRegistryConfig | None = None,
        # Wall time, as RocketMQ's brokerLiveTable uses: last-update times are shown to
        # operators. A clock jump forward can expire brokers early; they come back at their
        # next heartbeat.
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.config = config or EmbeddedRegistryConfig()
        self._clock_ms = clock_ms
        self._table = RouteTable()
        self._last_update_ms = 0
        self._scanner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._scanner is None:
            self._scanner = asyncio.create_task(self._scan_forever(), name="expire-brokers")

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
            self._scanner = None

    async def register(self, reg: BrokerRegistration) -> MasterAddresses:
        now = self._clock_ms()
        before = self._table.lookup(reg.address)
        try:
            master = self._table.register(reg, now)
        except RegistrationRejected as e:
            log.warning("refused registration of %s: %s", reg.address, e)
            raise
        finally:
            # A refused registration may still have removed a stale broker: that is a change too.
            self._last_update_ms = now
        if reg.delta is None and len(reg.topics) >= FREEZE_AFTER_TOPICS:
            # A large table lives until the broker's next full registration: out of the
            # collector's sight, a full collection no longer walks it (about 100 ms at 100,000
            # topics, every query waiting).
            gc.freeze()
        if self._table.lookup(reg.address) != before:  # new, or moved (e.g. promoted to master)
            log.info(
                "registered %s/%s id %d at %s (epoch %d)",
                reg.cluster,
                reg.broker_name,
                reg.broker_id,
                reg.address,
                reg.epoch,
            )
        return master

    async def unregister(
        self, cluster: str, broker_name: str, broker_id: int, address: str
    ) -> bool:
        removed = self._table.unregister(cluster, broker_name, broker_id, address)
        if removed:
            self._last_update_ms = self._clock_ms()
            log.info("unregistered %s/%s id %d at %s", cluster, broker_name, broker_id, address)
        return removed

    async def route(self, topic: str) -> TopicRoute | None:
        return self._table.route(topic)

    async def cluster_info(self) -> list[ClusterInfo]:
        return self._table.cluster_info()

    async def topic_count(self) -> int:
        return self._table.topic_count()

    async def status(self) -> RegistryStatus:
        return RegistryStatus(
            registry="embedded",
            stale=False,  # the table is the registry itself: it can't be out of reach
            last_update_ms=self._last_update_ms,
            brokers=self._table.broker_count(),
            detail=(
                f"broker expiry {self.config.broker_expiry_ms} ms, "
                f"scan every {self.config.scan_interval_ms} ms"
            ),
        )

    def expire_now(self) -> int:
        """One expiry pass (what the scanner runs); returns how many brokers were removed."""
        now = self._clock_ms()
        removed = self._table.expire(now, self.config.broker_expiry_ms)
        for ref in removed:
            log.warning(
                "expired %s/%s id %d at %s: silent for more than %d ms",
                ref.cluster,
                ref.broker_name,
                ref.broker_id,
                ref.address,
                self.config.broker_expiry_ms,
            )
        if removed:
            self._last_update_ms = now
        return len(removed)

    async def _scan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval_ms / 1000)
            try:
                self.expire_now()
            except Exception:
                # A bug in one pass must not end expiry for the life of the process: dead brokers
                # would then stay in the routes forever. Log it loudly and scan again.
                log.exception("broker expiry scan failed")
