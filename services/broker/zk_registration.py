"""A broker's registration in ZooKeeper: an ephemeral leaf and its topic shards, kept in step
with the broker.

The znodes (paths and bytes: ``tidemq.services.nameserver.zk_format``) live under the broker's
own kazoo session, so they disappear when the broker does:

- clean shutdown: ``stop`` deletes the leaf at once (the broker leaves the routes), then closes
  the session, which deletes the shards;
- SIGKILL, a frozen process, a lost network: ZooKeeper deletes them when the session expires.

Keeping them in step, on every wake-up:

- the topics go first (``zk_topic_shards``): only the shards whose topics changed are written,
  so a topic created costs one small write whatever the broker holds; nameservers that see a
  new leaf thus find its topics already there;
- the leaf (``sync_znode``) is written only when what it says changed (identity, addresses,
  role, epoch; not the topic data version, which would rewrite it on every topic change), and
  is otherwise checked (it is missing: create it; ours with other bytes: set them, conditional
  on the version just read), except right after shards were written under a leaf known to be
  ours, when the watch on it is check enough;
- another session's leaf or shard: either a second broker registered under the same
  cluster/name/id, or this broker's previous process (SIGKILLed, restarted at once) whose
  session has not expired yet. We wait: the watch left on it wakes us when it goes, and we
  register then.

Wake-ups: every (re)connection, since after a LOST session kazoo silently opens a new session
and the old session's znodes are gone (everything is written again); any change to the leaf (an
operator deleting it); the broker's register loop (at start, when topics change, and every
``register_interval_ms`` as a check); and a retry with backoff after a failed attempt. A create
whose answer was lost with the connection may have succeeded: the next attempt then finds the
znode already ours.

A slave also reads its master's znode (id 0 of its group) after each sync, with a watch, and
hands the master's address and HA address to ``on_master``: a slave registered only in ZooKeeper
finds its master the way a nameserver would.

While ZooKeeper is unreachable the broker keeps serving; its znode stays as long as its session
does. kazoo calls listeners and watches in its own threads: they only wake the asyncio loop.
ZooKeeper calls run in the loop's default executor, one attempt at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, ConnectionLoss, NoNodeError

from tidemq.protos.tls import TlsSettings
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicManager
from tidemq.services.broker.zk_leaf import (
    LeafTarget,
    Synced,
    ZnodeHeldElsewhereError,
    ZnodeRaceError,
    leaf_target,
    sync_znode,
)
from tidemq.services.broker.zk_topic_shards import ShardBook, delete_own_shards, sync_shards
from tidemq.services.errors import ServiceError
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import BrokerRegistration
from tidemq.services.zk_session import ZK_ERRORS, KazooLoopBridge, new_client
from tidemq.storage.errors import ConfigError

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 10.0
LEAVE_TIMEOUT_S = 2.0  # each ZooKeeper call at shutdown; the session's close removes it anyway


class ZkRegistration(KazooLoopBridge):
    """The broker's znode; ``start``, ``refresh`` and ``stop`` are called on the event loop."""

    def __init__(
        self,
        hosts: str,
        session_timeout_ms: int,
        node: Callable[[], LeafTarget],
        topics: TopicManager,
        digest: tuple[str, str] | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.hosts = hosts
        self.tls = tls  # ZooKeeper over TLS, with the broker's own certificate (zk_tls)
        self.session_timeout_ms = session_timeout_ms
        self.digest = digest  # the ZooKeeper identity its znodes belong to (zk_auth)
        # Called on the loop: it reads the topic table and the role. The path moves when the
        # role does (under automatic failover the master registers as id 0).
        self._node = node
        self._topics = topics
        target = node()
        zk_format.encode_leaf(target.registration)  # a broker that cannot register fails now
        self.path = target.path
        self.shard_dir = target.shard_dir
        # What was last written, and under which session (kazoo's thread reads and writes these,
        # one sync at a time).
        self._book = ShardBook()
        self._leaf: tuple[int, str, BrokerRegistration, bytes] | None = None
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._retry: asyncio.TimerHandle | None = None
        self._connected = False
        self._held_by = 0  # the other session last seen holding our path, to log it once
        self.registered = False  # our znode exists with our latest data, as of the last sync
        # Set on a slave: the group's master znode, and who hears where the master is.
        self.master_path = ""
        self.master_node: zk_format.BrokerNodeName | None = None
        self.on_master: Callable[[str, str], None] | None = None

    @classmethod
    def for_broker(
        cls, config: BrokerConfig, topics: TopicManager, role: RoleState
    ) -> ZkRegistration:
        def node() -> LeafTarget:
            return leaf_target(config, topics, role)

        try:
            registration = cls(
                config.zk_hosts,
                config.zk_session_timeout_ms,
                node,
                topics,
                config.zk_digest,
                config.zk_client_tls,
            )
        except (ServiceError, zk_format.ZnodeDataError) as e:
            # Fail now, loudly, rather than run a broker no nameserver will ever route to.
            raise ConfigError(f"this broker cannot register in ZooKeeper: {e}") from None
        if config.broker_id != 0 and not role.automatic:
            registration.master_path = zk_format.node_path(
                config.zk_root, config.cluster, config.broker_name, 0
            )
            registration.master_node = zk_format.parse_node_name(
                config.cluster, config.broker_name, "0"
            )
        return registration

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._client = new_client(self.hosts, self.session_timeout_ms, self.digest, self.tls)
        self._client.add_listener(self._on_session_event)
        self._task = asyncio.create_task(self._run(), name="zk-registration")
        # Not waiting for the connection: the broker serves while ZooKeeper is away, and
        # registers as soon as it is reachable.
        await self._loop.run_in_executor(None, self._client.start_async)

    def refresh(self) -> None:
        """Bring the znode up to date (topics changed), or check that it is still there."""
        self._wake.set()

    async def stop(self) -> None:
        """Delete the znode, then close the session (which would delete it too)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._retry is not None:
            self._retry.cancel()
        # A sync still running in its thread may create the znode after this; the session's
        # close below removes anything the session owns all the same.
        self._client.remove_listener(self._on_session_event)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._leave)
        except Exception:
            # The broker's shutdown goes on to close its store cleanly whatever happened here;
            # the session expires on its own and takes the znode with it.
            log.exception("leaving ZooKeeper failed")

    # -- the loop -------------------------------------------------------------------------------

    def _session_changed(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected = True
            self._wake.set()
            return
        self._connected = False
        if state == KazooState.LOST:
            self.registered = False
            log.warning(
                "ZooKeeper session expired: %s is gone and this broker is out of the routes; "
                "registering again once reconnected",
                self.path,
            )
        else:
            log.warning(
                "connection to ZooKeeper %s lost; still serving, and still registered while "
                "the session lives",
                self.hosts,
            )

    def _retry_in(self, delay_s: float) -> None:
        assert self._loop is not None
        if self._retry is not None:
            self._retry.cancel()
        self._retry = self._loop.call_later(delay_s, self._wake.set)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        timeout_s = self.session_timeout_ms / 1000
        backoff_s = RETRY_MIN_S
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._connected:
                continue  # the next CONNECTED wakes us
            try:
                target = self._node()
            except ServiceError as e:
                # The znodes keep the last registration that was valid; the next change retries.
                # The message says what is wrong; a traceback would add nothing.
                log.error("cannot update the ZooKeeper registration: %s", e)  # noqa: TRY400
                continue
            try:
                if target.path != self.path:
                    # A role change: the old znodes go first, so no nameserver sees this
                    # broker twice.
                    await loop.run_in_executor(None, self._move_out, timeout_s)
                    log.info("registration moves from %s to %s", self.path, target.path)
                    self.path, self.shard_dir = target.path, target.shard_dir
                outcome = await loop.run_in_executor(None, self._sync, target, timeout_s)
            except zk_format.ZnodeDataError as e:
                log.error("cannot update the ZooKeeper registration: %s", e)  # noqa: TRY400
                continue
            except ZnodeHeldElsewhereError as e:
                self.registered = False
                if e.owner != self._held_by:
                    self._held_by = e.owner
                    log.warning(
                        "%s: another broker with this cluster, name and id, or this broker's "
                        "previous process whose session has not expired yet; registering as "
                        "soon as it goes",
                        e,
                    )
                continue  # the watch left on the znode wakes us when it changes or goes
            except (*ZK_ERRORS, ZnodeRaceError) as e:
                self.registered = False
                log.warning(
                    "registering in ZooKeeper failed (%s: %s); retrying in %.1f s",
                    type(e).__name__,
                    e,
                    backoff_s,
                )
                self._retry_in(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_MAX_S)
                continue
            backoff_s = RETRY_MIN_S
            self._held_by = 0
            self.registered = True
            if outcome is Synced.CREATED:
                log.info("registered in ZooKeeper %s as %s", self.hosts, self.path)
            elif outcome is Synced.UPDATED:
                log.info("updated the ZooKeeper registration %s", self.path)
            if self.on_master is not None:
                await self._find_master(loop)

    def _sync(self, target: LeafTarget, timeout_s: float) -> Synced:
        """Shards, then the leaf (see the module docstring); in kazoo's executor thread."""
        client = self._client
        client_id = client.client_id
        if client_id is None:
            raise ConnectionLoss("not connected to ZooKeeper")
        session = client_id[0]
        leaf = self._leaf
        ours = leaf is not None and leaf[:2] == (session, target.path)
        if not ours:
            # Before writing shards: a leaf of another session means its shards are there too.
            stat = client.exists_async(target.path, watch=self._on_watch).get(timeout=timeout_s)
            if stat is not None and stat.ephemeralOwner != session:
                raise ZnodeHeldElsewhereError(target.path, stat.ephemeralOwner)
        written = sync_shards(
            client, self._book, self._topics, target.shard_dir, self._on_watch, timeout_s
        )
        same = leaf is not None and zk_format.without_topics(leaf[2]) == zk_format.without_topics(
            target.registration
        )
        if ours and same and written:
            return Synced.UNCHANGED  # the watch on the leaf tells us if it goes
        # An unchanged leaf keeps its bytes (and the data version they carry).
        reg, data = (
            (leaf[2], leaf[3])
            if leaf is not None and same
            else (target.registration, zk_format.encode_leaf(target.registration))
        )
        outcome = sync_znode(client, target.path, data, self._on_watch, timeout_s)
        self._leaf = (session, target.path, reg, data)
        return outcome

    def _move_out(self, timeout_s: float) -> None:
        self._delete_own(self.path)
        if self._client.client_id is not None:
            delete_own_shards(self._client, self.shard_dir, LEAVE_TIMEOUT_S)
        self._leaf = None
        self._book = ShardBook()

    async def _find_master(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            found = await loop.run_in_executor(None, self._read_master)
        except (*ZK_ERRORS, zk_format.ZnodeDataError) as e:
            log.warning("reading the master's znode %s failed: %s", self.master_path, e)
            self._retry_in(RETRY_MAX_S)
            return
        if found is not None and self.on_master is not None:
            self.on_master(*found)

    def _read_master(self) -> tuple[str, str] | None:
        """The master's (address, HA address), or None while the group has no master; the watch
        wakes the loop when that changes."""
        assert self.master_node is not None
        client = self._client
        if client.exists(self.master_path, watch=self._on_watch) is None:
            return None
        try:
            data, _ = client.get(self.master_path, watch=self._on_watch)
        except NoNodeError:
            return None
        reg = zk_format.decode_registration(self.master_node, data)
        return reg.address, reg.ha_address

    @property
    def client(self) -> Any:
        """The broker's ZooKeeper session (automatic failover shares it: one broker, one
        session, so its registration and its leadership die together)."""
        return self._client

    def _delete_own(self, path: str) -> bool:
        client = self._client
        client_id = client.client_id
        if client_id is None:
            return False
        stat = client.exists_async(path).get(timeout=LEAVE_TIMEOUT_S)
        if stat is None or stat.ephemeralOwner != client_id[0]:
            return False
        with contextlib.suppress(NoNodeError, BadVersionError):
            client.delete_async(path, version=stat.version).get(timeout=LEAVE_TIMEOUT_S)
        return True

    def _leave(self) -> None:
        client = self._client
        try:
            if self._delete_own(self.path):
                log.info("unregistered from ZooKeeper: deleted %s", self.path)
        except ZK_ERRORS as e:
            log.warning("deleting %s failed (%s); closing the session removes it", self.path, e)
        finally:
            try:
                client.stop()
            finally:
                client.close()
        self.registered = False
