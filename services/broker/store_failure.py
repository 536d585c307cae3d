"""What a broker does when its store fails (the disk failed a flush or a write): it steps aside.

A store that failed refuses every append until the process restarts, so a broker that stayed
master, SERVING and in the routes would have its group refuse all writes while every probe is
green. Instead, once:

- gRPC health answers NOT_SERVING, for the whole server ("") and the Broker service;
- it leaves the routes: no more heartbeats, an unregister to every nameserver, its ZooKeeper
  registration deleted;
- under automatic failover it resigns: steps down (acknowledges nothing more), deletes its
  leader znode so an in-sync slave is elected at once, and its candidate znode so it is not
  elected again.

The store logs why it failed; the metrics (``tidemq_store_failed``) show it; a restart on a
repaired disk recovers the store as after any crash and the broker serves again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from grpc_health.v1 import health, health_pb2

from tidemq.services.broker.auto_failover import AutomaticFailover
from tidemq.services.broker.zk_registration import ZkRegistration
from tidemq.storage.failure import StoreFailure

log = logging.getLogger(__name__)


@dataclass
class StepAside:
    health: health.aio.HealthServicer
    services: tuple[str, ...]
    unregister: Callable[[], Awaitable[None]]
    zk: ZkRegistration | None
    failover: AutomaticFailover | None
    # Set once the broker has begun stepping aside: its heartbeats stop.
    stepped_aside: bool = False

    def on_store_failure(self, loop: asyncio.AbstractEventLoop) -> Callable[[StoreFailure], None]:
        """The store's failure listener: it runs in a store thread and only hands over."""

        def listener(failure: StoreFailure) -> None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.run(failure)))

        return listener

    async def run(self, failure: StoreFailure) -> None:
        if self.stepped_aside:
            return
        self.stepped_aside = True
        # A warning: the store's ERROR line says why; this one says what the broker does.
        log.warning(
            "store failed (%s): stepping aside: NOT_SERVING, out of the routes%s; restart this "
            "broker once its disk is repaired",
            failure.reason,
            ", mastership given up" if self.failover is not None else "",
        )
        for service in self.services:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.failover is not None:
            # Before the session closes with the registration: the leader znode goes first,
            # explicitly, so the slaves elect now.
            await self.failover.resign(f"the store failed ({failure.reason}): {failure.error}")
        if self.zk is not None:
            await self.zk.stop()
        await self.unregister()
