"""The ZooKeeper registry backend: a nameserver that reads its routes from brokers' znodes.

Each broker keeps an ephemeral leaf and ephemeral topic shards under its own ZooKeeper session
(layout and format: ``zk_format``); a nameserver holds no state of its own. It watches the two
subtrees with kazoo's ``TreeCache`` recipe, which reads everything once and then re-reads only
the znode a watch names, and hands each change to ``zk_view.RegistryView``:

- a shard changed (a topic created, changed or deleted): applied to the route table in place,
  costing the topics of that one shard, not every topic held;
- a leaf changed (a broker joined, left, changed role or epoch): the table is rebuilt once from
  every znode held, however many changed together.

So every nameserver that holds the same znodes answers QueryRoute and GetClusterInfo
identically, byte for byte, however its watch events interleaved (``zk_view`` says exactly what
converges). The RouteTable's rules apply unchanged (queue data from masters, displaced
addresses, epoch fencing, one cluster per group), and invalid znodes are skipped and logged,
never served and never fatal. After a lost session the caches read everything again once.

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
- The nameserver only reads: it needs read access to ``<root>/clusters`` and ``<root>/topics``
  and creates nothing.

kazoo's session callbacks and the caches' listeners only hand the event to the asyncio loop
(``zk_session``); the view and its table are changed and queried on the loop alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException
from kazoo.recipe.cache import TreeCache, TreeEvent

from tidemq.protos.tls import TlsSettings
from tidemq.services.nameserver import zk_format, zk_settings
from tidemq.services.nameserver.registry import (
    FREEZE_AFTER_TOPICS,
    HeartbeatsRefusedError,
    RegistryStatus,
    RegistryUnavailableError,
)
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    ClusterInfo,
    MasterAddresses,
    TopicRoute,
)
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.services.nameserver.zk_routes import BrokerZnode, members
from tidemq.services.nameserver.zk_view import RegistryView, ShardZnode
from tidemq.services.zk_session import KazooLoopBridge, new_client
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

LEAVES = "leaves"
SHARDS = "shards"


@dataclass(frozen=True)
class ZooKeeperRegistryConfig:
    hosts: str  # HOST:PORT[,HOST:PORT...][/chroot]
    root: str = zk_settings.DEFAULT_ROOT
    # This session owns no znodes; its timeout only bounds how long a silent connection takes to
    # be noticed (kazoo gives up on a read after 2/3 of it and the routes turn stale).
    session_timeout_ms: int = zk_settings.DEFAULT_SESSION_TIMEOUT_MS
    # ZooKeeper over TLS, with the nameserver's own certificate (``--zk-tls``).
    tls: TlsSettings | None = None

    def __post_init__(self) -> None:
        zk_settings.check_hosts(self.hosts)
        zk_settings.check_root(self.root)
        zk_settings.check_session_timeout_ms(self.session_timeout_ms)


class ReadOnlyTreeCache(TreeCache):  # type: ignore[misc]
    """kazoo's TreeCache without the ``ensure_path`` its ``start`` does: a nameserver creates
    nothing (it may only have read access) and must start while ZooKeeper is away. A missing
    top is watched until a broker creates it; the rest is the recipe's own code."""

    def start(self) -> None:
        if self._state != self.STATE_LATENT:  # type: ignore[has-type]
            raise KazooException("already started or closed")
        self._state = self.STATE_STARTED
        self._task_thread = self._client.handler.spawn(self._do_background)
        self._client.add_listener(self._session_watcher)
        if self._client.connected:
            self._in_background(self._root.on_created)


# -- the backend ----------------------------------------------------------------------------------


class ZooKeeperRegistry(KazooLoopBridge):
    """Routes read from ZooKeeper; see the module docstring for the behaviour."""

    def __init__(
        self, config: ZooKeeperRegistryConfig, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self.config = config
        self._clock_ms = clock_ms
        self._client: Any = None
        self._caches: list[Any] = []
        self._tops = {
            LEAVES: zk_format.clusters_path(config.root),
            SHARDS: zk_format.topics_path(config.root),
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._pending: list[tuple[str, Any]] = []
        self._view = RegistryView()
        self._table: RouteTable | None = None
        self._problems: dict[str, str] = {}
        self._connected = False
        # Caches that have not read everything since the start or the last lost session.
        self._unread = {LEAVES, SHARDS}
        self._in_sync = False
        self._state = "connecting"
        self._last_update_ms = 0

    @property
    def where(self) -> str:
        return f"{self.config.hosts} {self.config.root}"

    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        client = self._client = new_client(
            self.config.hosts, self.config.session_timeout_ms, tls=self.config.tls
        )
        client.add_listener(self._on_session_event)
        self._task = asyncio.create_task(self._apply_forever(), name="zk-routes")
        for kind, top in self._tops.items():
            cache = ReadOnlyTreeCache(client, top)
            cache.listen(functools.partial(self._on_tree_event, kind))
            cache.listen_fault(self._on_fault)
            cache.start()
            self._caches.append(cache)
        # Not waiting for the connection: the nameserver serves (stale) while ZooKeeper is away.
        await self._loop.run_in_executor(None, client.start_async)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        for cache in self._caches:
            cache.close()
        self._caches = []
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

    async def topic_count(self) -> int:
        return self._loaded().topic_count()

    async def status(self) -> RegistryStatus:
        detail = f"ZooKeeper {self.where}: {self._state}"
        if self._table is None:
            detail += ", routes never read"
        if self._problems:
            detail += f", {len(self._problems)} znode(s) skipped (see the log)"
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

    # -- kazoo's threads ----------------------------------------------------------------------

    def _on_tree_event(self, kind: str, event: Any) -> None:
        self._post(self._queue, kind, event)

    def _on_fault(self, error: BaseException) -> None:
        log.warning("watching ZooKeeper %s: %s: %s", self.where, type(error).__name__, error)

    # -- the loop -----------------------------------------------------------------------------

    def _queue(self, kind: str, event: Any) -> None:
        self._pending.append((kind, event))
        self._wake.set()

    def _session_changed(self, state: str) -> None:
        self._state = state.lower()
        if state == KazooState.CONNECTED:
            self._connected = True
            log.info("connected to ZooKeeper %s", self.where)
        else:
            self._connected = False
            if state == KazooState.LOST:
                # The caches read everything again under the new session (watches died with
                # the old one); until they have, the routes may miss changes.
                self._unread = {LEAVES, SHARDS}
            if self._in_sync:
                log.warning(
                    "ZooKeeper %s %s: serving the last routes read (stale) until it is back",
                    self.where,
                    "session expired" if state == KazooState.LOST else "connection lost",
                )
        self._update_sync()

    def _update_sync(self) -> None:
        # Within one session the watches survive a reconnection (the client re-arms them with
        # the last zxid it saw, so the server fires those whose znodes changed meanwhile).
        in_sync = self._connected and not self._unread and self._table is not None
        if in_sync and not self._in_sync:
            log.info(
                "routes in sync with ZooKeeper %s: %d broker(s), %d topic(s)",
                self.where,
                self._table.broker_count() if self._table else 0,
                self._table.topic_count() if self._table else 0,
            )
        self._in_sync = in_sync

    async def _apply_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            events, self._pending = self._pending, []
            try:
                self._apply(events)
            except Exception:
                # A bug must not stop route updates for the life of the process: the table
                # keeps serving, stale, and the next event tries again.
                log.exception("applying ZooKeeper changes to the routes failed")
                self._in_sync = False
                continue
            self._update_sync()

    def _apply(self, events: list[tuple[str, Any]]) -> None:
        changed = False
        for kind, event in events:
            if event.event_type == TreeEvent.INITIALIZED:
                self._unread.discard(kind)
            elif event.event_type in (
                TreeEvent.NODE_ADDED,
                TreeEvent.NODE_UPDATED,
                TreeEvent.NODE_REMOVED,
            ):
                changed |= self._apply_node(kind, event.event_type, event.event_data)
        if self._table is None and self._unread:
            return  # the first table waits for the first complete read
        before = set() if self._table is None else members(self._table)
        if self._view.settle():
            self._table = self._view.table
            if self._table is not None and self._table.topic_count() >= FREEZE_AFTER_TOPICS:
                gc.freeze()  # as the embedded registry does after a large registration
            after = members(self._table) if self._table is not None else set()
            for cluster, name, broker_id, address in sorted(after - before):
                log.info("broker %s/%s id %d at %s joined", cluster, name, broker_id, address)
            for cluster, name, broker_id, address in sorted(before - after):
                log.info("broker %s/%s id %d at %s left", cluster, name, broker_id, address)
        if changed:
            self._last_update_ms = self._clock_ms()
            self._report_problems()

    def _apply_node(self, kind: str, event_type: int, node: Any) -> bool:
        top = self._tops[kind]
        if not node.path.startswith(top + "/"):
            return False
        parts = node.path[len(top) + 1 :].split("/")
        removed = event_type == TreeEvent.NODE_REMOVED
        if kind == LEAVES and len(parts) == 3:
            cluster, name, broker_id = parts
            if removed:
                self._view.remove_leaf((cluster, name, broker_id))
            else:
                stat = node.stat
                self._view.set_leaf(
                    BrokerZnode(
                        cluster,
                        name,
                        broker_id,
                        node.data,
                        stat.czxid,
                        stat.mtime,
                        stat.ephemeralOwner,
                    )
                )
            return True
        if kind == SHARDS and len(parts) == 4:
            cluster, name, broker_id, shard = parts
            if removed:
                self._view.remove_shard((cluster, name, broker_id), shard)
            else:
                self._view.set_shard(
                    ShardZnode(cluster, name, broker_id, shard, node.data, node.stat.ephemeralOwner)
                )
            return True
        return False  # a parent znode

    def _report_problems(self) -> None:
        problems = self._view.problems
        for path in sorted(problems.keys() - self._problems.keys()):
            log.warning("skipping znode %s: %s", path, problems[path])
        for path in sorted(self._problems.keys() - problems.keys()):
            log.info("znode %s is no longer skipped", path)
        self._problems = problems


def _close(client: Any) -> None:
    try:
        client.stop()
    finally:
        client.close()
