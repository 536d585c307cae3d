"""The ZooKeeper registry backend: a nameserver that reads its routes from brokers' znodes.

Each broker keeps an ephemeral znode under its own ZooKeeper session (layout and format:
``zk_format``); a nameserver holds no state of its own. It reads the whole broker tree with
one-shot watches set on every level, and any watch event (a broker joined, left, changed its
topics) or reconnection triggers another full read. Each read is a snapshot from which a fresh
``RouteTable`` is built (``zk_routes.build_route_table``), so every nameserver that has read the
same znodes answers QueryRoute and GetClusterInfo identically, byte for byte, however its watch
events interleaved. The RouteTable's rules apply unchanged (queue data from masters,
displaced addresses, epoch fencing, one cluster per group), and invalid znodes are skipped and
logged, never served and never fatal. A full read costs one pipelined round trip per tree level
and events arriving during a read coalesce into one more read, so the cost stays small for the
hundreds of brokers a cluster has; brokers only write their znode when their topics change.

What an operator sees:

- ZooKeeper unreachable (connection suspended, or session lost): the nameserver keeps answering
  from the last routes it read and GetStatus says ``stale=True``; the next successful read after
  reconnecting clears it. A SIGKILLed broker leaves the routes when ZooKeeper expires its session.
- Before the first read completes (ZooKeeper not reachable since start), QueryRoute and
  GetClusterInfo answer UNAVAILABLE (retriable) instead of a NOT_FOUND that would tell clients a
  topic does not exist; the nameserver still starts, so nameservers and ZooKeeper may start in
  any order.
- RegisterBroker is refused with FAILED_PRECONDITION: a broker heartbeating to this nameserver
  without ``--zk`` would otherwise believe it is registered while no client can find it. A
  broker started with both ``--zk`` and ``--nameserver`` pointing here logs that refusal; drop
  ``--nameserver``, or point it at nameservers on the embedded registry.
- UnregisterBroker is accepted and changes nothing (the znode belongs to the broker's session,
  which deletes it at shutdown): a broker with both flags shuts down without errors.
- The nameserver only reads: it needs read access to ``<root>/clusters`` and creates nothing.

kazoo's session and watch callbacks only hand the event to the asyncio loop (``zk_session``).
Reads run in the loop's default executor; the table is built, swapped and queried on the loop
alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import NoNodeError

from tidemq.protos.tls import TlsSettings
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.registry import (
    HeartbeatsRefusedError,
    RegistryStatus,
    RegistryUnavailableError,
)
from tidemq.services.nameserver.route_table import (
    BrokerRegistration,
    ClusterInfo,
    MasterAddresses,
    RouteTable,
    TopicRoute,
)
from tidemq.services.nameserver.zk_routes import (
    BrokerZnode,
    build_route_table,
    members,
    routes_view,
)
from tidemq.services.zk_session import ZK_ERRORS, KazooLoopBridge, new_client
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

READ_RETRY_DELAY_S = 1.0  # after a failed read while still connected (e.g. a timeout)


@dataclass(frozen=True)
class ZooKeeperRegistryConfig:
    hosts: str  # HOST:PORT[,HOST:PORT...][/chroot]
    root: str = zk_format.DEFAULT_ROOT
    # This session owns no znodes; its timeout only bounds how long a silent connection takes to
    # be noticed (kazoo gives up on a read after 2/3 of it and the routes turn stale).
    session_timeout_ms: int = zk_format.DEFAULT_SESSION_TIMEOUT_MS
    # ZooKeeper over TLS, with the nameserver's own certificate (``--zk-tls``).
    tls: TlsSettings | None = None

    def __post_init__(self) -> None:
        zk_format.check_hosts(self.hosts)
        zk_format.check_root(self.root)
        zk_format.check_session_timeout_ms(self.session_timeout_ms)


# -- I/O: reading the tree -----------------------------------------------------------------------


def read_znodes(
    client: Any, root: str, watch: Callable[[Any], None], timeout_s: float
) -> list[BrokerZnode]:
    """Every broker leaf under ``root``, with ``watch`` set on every level read.

    Requests of one level are pipelined, so a read costs four round trips whatever the number of
    brokers. A znode deleted between two levels is left out; its watch brings the next read.
    """
    top = zk_format.clusters_path(root)
    if client.exists_async(top, watch=watch).get(timeout=timeout_s) is None:
        return []  # no broker has registered yet; the watch fires when one creates it

    def children(paths: list[str]) -> list[tuple[str, list[str]]]:
        pending = [(p, client.get_children_async(p, watch=watch)) for p in paths]
        found = []
        for path, result in pending:
            with contextlib.suppress(NoNodeError):
                found.append((path, sorted(result.get(timeout=timeout_s))))
        return found

    clusters = [zk_format.join(top, c) for _, names in children([top]) for c in names]
    groups = [zk_format.join(p, g) for p, names in children(clusters) for g in names]
    leaves = [zk_format.join(p, i) for p, names in children(groups) for i in names]
    pending = [(p, client.get_async(p, watch=watch)) for p in leaves]
    znodes = []
    for path, result in pending:
        try:
            data, stat = result.get(timeout=timeout_s)
        except NoNodeError:
            continue
        cluster, broker_name, broker_id = path[len(top) + 1 :].split("/")
        znodes.append(
            BrokerZnode(
                cluster=cluster,
                broker_name=broker_name,
                broker_id=broker_id,
                data=data,
                czxid=stat.czxid,
                mtime_ms=stat.mtime,
                ephemeral_owner=stat.ephemeralOwner,
            )
        )
    return znodes


# -- the backend ----------------------------------------------------------------------------------


class ZooKeeperRegistry(KazooLoopBridge):
    """Routes read from ZooKeeper; see the module docstring for the behaviour."""

    def __init__(
        self, config: ZooKeeperRegistryConfig, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self.config = config
        self._clock_ms = clock_ms
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._table: RouteTable | None = None
        self._problems: dict[str, str] = {}
        self._connected = False
        self._in_sync = False
        # Bumped on every connection state change: a read that started before one cannot prove
        # the routes are current.
        self._generation = 0
        self._state = "connecting"
        self._last_update_ms = 0
        self._last_error = ""

    @property
    def where(self) -> str:
        return f"{self.config.hosts} {self.config.root}"

    async def start(self) -> None:
        if self._reader is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._client = new_client(
            self.config.hosts, self.config.session_timeout_ms, tls=self.config.tls
        )
        self._client.add_listener(self._on_session_event)
        self._reader = asyncio.create_task(self._read_forever(), name="zk-routes")
        # Not waiting for the connection: the nameserver serves (stale) while ZooKeeper is away.
        await self._loop.run_in_executor(None, self._client.start_async)

    async def stop(self) -> None:
        if self._reader is None:
            return
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._reader = None
        client = self._client
        client.remove_listener(self._on_session_event)
        await asyncio.get_running_loop().run_in_executor(None, _close, client)

    async def register(self, reg: BrokerRegistration) -> MasterAddresses:
        raise HeartbeatsRefusedError(
            f"this nameserver reads brokers from ZooKeeper ({self.where}) and takes no "
            f"heartbeats: start broker {reg.broker_name}/{reg.broker_id} with "
            f"--zk {self.config.hosts} --zk-root {self.config.root}"
        )

    async def unregister(
        self, cluster: str, broker_name: str, broker_id: int, address: str
    ) -> bool:
        return False  # the broker's own session removes its znode

    async def route(self, topic: str) -> TopicRoute | None:
        return self._loaded().route(topic)

    async def cluster_info(self) -> list[ClusterInfo]:
        return self._loaded().cluster_info()

    async def topics(self) -> list[str]:
        return self._loaded().topics()

    async def status(self) -> RegistryStatus:
        detail = f"ZooKeeper {self.where}: {self._state}"
        if self._table is None:
            detail += ", routes never read"
        if self._problems:
            detail += f", {len(self._problems)} znode(s) skipped (see the log)"
        if self._last_error and not self._in_sync:
            detail += f", last error: {self._last_error}"
        return RegistryStatus(
            registry="zookeeper",
            stale=not self._in_sync,
            last_update_ms=self._last_update_ms,
            brokers=0 if self._table is None else self._table.broker_count(),
            detail=detail,
        )

    def _loaded(self) -> RouteTable:
        if self._table is None:
            raise RegistryUnavailableError(
                f"this nameserver has not read its routes from ZooKeeper ({self.where}) yet"
            )
        return self._table

    # -- the loop -----------------------------------------------------------------------------

    def _session_changed(self, state: str) -> None:
        self._generation += 1
        self._state = state.lower()
        if state == KazooState.CONNECTED:
            self._connected = True
            log.info("connected to ZooKeeper %s; reading routes", self.where)
            self._wake.set()  # watches may have been lost with the session: read everything
            return
        self._connected = False
        if self._in_sync:
            log.warning(
                "ZooKeeper %s %s: serving the last routes read (stale) until it is back",
                self.where,
                "session expired" if state == KazooState.LOST else "connection lost",
            )
        self._in_sync = False

    async def _read_forever(self) -> None:
        loop = asyncio.get_running_loop()
        timeout_s = self.config.session_timeout_ms / 1000
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._connected:
                continue  # the next CONNECTED wakes us
            generation = self._generation
            try:
                znodes = await loop.run_in_executor(
                    None, read_znodes, self._client, self.config.root, self._on_watch, timeout_s
                )
            except ZK_ERRORS as e:
                self._last_error = f"{type(e).__name__}: {e}"
                log.warning("reading routes from ZooKeeper %s failed: %s", self.where, e)
                await asyncio.sleep(READ_RETRY_DELAY_S)
                self._wake.set()
                continue
            try:
                self._apply(znodes)
            except Exception:
                # A bug in the rebuild must not stop route updates for the life of the process;
                # the last good table keeps serving, stale, and the next event tries again.
                log.exception("rebuilding routes from ZooKeeper failed")
                self._in_sync = False
                continue
            if generation == self._generation and self._connected:
                if not self._in_sync:
                    log.info(
                        "routes in sync with ZooKeeper %s: %d broker(s)",
                        self.where,
                        self._table.broker_count() if self._table else 0,
                    )
                self._in_sync = True
                self._last_error = ""

    def _apply(self, znodes: list[BrokerZnode]) -> None:
        table, problems = build_route_table(znodes)
        for path in sorted(problems.keys() - self._problems.keys()):
            log.warning("skipping znode %s: %s", path, problems[path])
        for path in sorted(self._problems.keys() - problems.keys()):
            log.info("znode %s is no longer skipped", path)
        self._problems = problems
        old = self._table
        if old is not None and routes_view(old) == routes_view(table):
            return
        before = set() if old is None else members(old)
        after = members(table)
        for cluster, name, broker_id, address in sorted(after - before):
            log.info("broker %s/%s id %d at %s joined", cluster, name, broker_id, address)
        for cluster, name, broker_id, address in sorted(before - after):
            log.info("broker %s/%s id %d at %s left", cluster, name, broker_id, address)
        self._table = table
        self._last_update_ms = self._clock_ms()


def _close(client: Any) -> None:
    try:
        client.stop()
    finally:
        client.close()
