"""The failover agent: a broker's part in its group's automatic failover, over ZooKeeper.

Every ``tick`` (a quarter of the lease) and on every watch, the agent reads the group's znodes
(``failover_znodes``; the calls: ``failover_zk``) with the broker's own ZooKeeper session and
acts on what it saw; the decisions are ``tidemq.replication.election``'s, the role
change is the broker's (``FailoverHooks``).

- **Master**: renews its lease with each read that finds the leader znode still its own and the
  state still at its epoch; anything else (the session expired, a newer epoch) and it steps down
  at once. It moves the ISR with version-checked writes: a joining slave counts for
  acknowledgements before the write, a leaving one only stops counting after it.
- **Others**: publish their candidate znode (last epoch, max offset, priority), follow the
  leader the znode names, and when there is none, the best ranked live eligible broker takes
  over in one transaction (state version check + state write + leader create), so two brokers
  can never both win an epoch. The winner acknowledges nothing until a lease has passed since it
  saw the old leader gone (``role.RoleState``), unless the old master handed over on purpose.

ZooKeeper calls run in the loop's default executor with timeouts; a failed read is retried at
the next tick, while the lease runs out on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tidemq.replication.election import (
    Candidate,
    GroupState,
    ReplicaView,
    isr_after,
    should_elect_self,
)
from tidemq.services.broker import failover_znodes as zn
from tidemq.services.broker.failover_zk import GroupView, GroupZnodes
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.zk_leaf import ZnodeHeldElsewhereError, ZnodeRaceError
from tidemq.services.zk_session import ZK_ERRORS, KazooLoopBridge
from tidemq.storage.clock import monotonic_ms

log = logging.getLogger(__name__)


class FailoverHooks(Protocol):
    """What the agent asks of its broker."""

    def position(self) -> tuple[int, int]:
        """(newest epoch in the epoch file, CommitLog max offset)."""
        ...

    async def take_over(self, state: GroupState, sent_ms: int, gone_seen_ms: int) -> None: ...

    async def step_down(self, reason: str) -> None: ...

    async def follow(self, leader: zn.Leader) -> None: ...

    def replica_views(self) -> dict[int, ReplicaView]: ...

    def epoch_start_offset(self) -> int: ...

    def set_isr(self, isr: frozenset[int]) -> None: ...


@dataclass(frozen=True)
class FailoverSettings:
    priority: int
    unclean: bool
    isr_max_lag_ms: int
    settle_ms: int
    address: str  # the Broker service address, for status
    ha_address: str  # where slaves replicate from


# How an election this broker took part in (it saw the group without a master) ended for it:
# won (it wrote the new epoch and took over), lost (another broker's leader znode appeared:
# it ranked lower, or its own write lost the race), take_over_failed (it won the write but
# could not take over, and let go).
ELECTION_OUTCOMES = ("won", "lost", "take_over_failed")


class FailoverAgent(KazooLoopBridge):
    def __init__(
        self,
        client: Callable[[], Any],
        paths: zn.GroupPaths,
        role: RoleState,
        settings: FailoverSettings,
        hooks: FailoverHooks,
    ) -> None:
        self._get_client = client
        self.paths = paths
        self.role = role
        self.settings = settings
        self.hooks = hooks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.tick_ms = max(50, role.lease_ms // 4)
        self.timeout_s = max(0.2, role.lease_ms / 2000)
        self.znodes = GroupZnodes(paths, self.timeout_s)
        self._gone_since: int | None = None  # when this broker first saw the group masterless
        self._published: tuple[int, bytes] | None = None  # (session, candidate bytes)
        self.view: GroupView | None = None  # the last one read, for status
        self.waiting_reason = ""
        self._leader_session = 0  # our session when we won, to recognise our leader znode
        self._switching = False  # a switchover is handing the group over: no renewals
        # Elections this broker saw through, by outcome (ELECTION_OUTCOMES), for metrics.
        self.elections: dict[str, int] = dict.fromkeys(ELECTION_OUTCOMES, 0)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._get_client().add_listener(self._on_session_event)
        self._task = asyncio.create_task(self._run(), name="failover-agent")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            self._get_client().remove_listener(self._on_session_event)

    def _session_changed(self, state: str) -> None:
        if state != KazooState.CONNECTED:
            log.warning("ZooKeeper connection %s: the master lease is not renewed", state.lower())
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_ms / 1000):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.step()
            except ZK_ERRORS as e:
                log.debug("failover step: ZooKeeper unavailable (%s)", e)
            except zn.FailoverZnodeError as e:
                log.error("failover znode unreadable, nothing done: %s", e)  # noqa: TRY400
            except Exception:  # a bug must not end failover for good: logged, retried
                log.exception("failover step failed")

    # -- one step ---------------------------------------------------------------------------

    async def step(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._get_client()
        if client is None or client.client_id is None or not client.connected:
            return
        if not self.role.is_master:
            await loop.run_in_executor(None, self._publish, client)
        sent = monotonic_ms()
        view = await loop.run_in_executor(
            None, self.znodes.read, client, not self.role.is_master, self._watch
        )
        received = monotonic_ms()
        self.view = view
        if self.role.is_master:
            await self._as_master(client, view, sent)
        else:
            await self._as_follower(client, view, received)

    def _watch(self, _event: Any) -> None:
        self._post(self._wake.set)

    def _publish(self, client: Any) -> None:
        last_epoch, max_offset = self.hooks.position()
        s = self.settings
        data = zn.encode_candidate(
            zn.CandidateNode(
                Candidate(self.role.own_id, last_epoch, max_offset, s.priority), s.address
            )
        )
        session = client.client_id[0]
        if self._published == (session, data):
            return
        try:
            self.znodes.publish_candidate(client, self.role.own_id, data, self._watch)
        except (ZnodeHeldElsewhereError, ZnodeRaceError) as e:
            log.warning("candidate znode: %s", e)
            return
        self._published = (session, data)

    # -- master -----------------------------------------------------------------------------

    async def _as_master(self, client: Any, view: GroupView, sent: int) -> None:
        role = self.role
        me = role.own_id
        session = client.client_id[0]
        why = ""
        if view.leader is None or view.leader_owner != self._leader_session:
            why = "its leader znode is gone (ZooKeeper session expired?)"
        elif session != self._leader_session:
            why = "its ZooKeeper session was replaced"
        elif view.state is None or view.state.epoch != role.epoch or view.state.master_id != me:
            got = view.state.epoch if view.state is not None else None
            why = f"the group moved on to epoch {got}"
        if why:
            await self._step_down(f"no longer the master of epoch {role.epoch}: {why}")
            return
        assert view.state is not None
        if self._switching:
            return
        role.renew(sent)
        await self._maintain_isr(client, view.state, view.state_version)

    async def _maintain_isr(self, client: Any, state: GroupState, version: int) -> None:
        s = self.settings
        isr = isr_after(
            state,
            self.hooks.replica_views(),
            self.hooks.epoch_start_offset(),
            monotonic_ms(),
            s.isr_max_lag_ms,
            s.isr_max_lag_ms,
        )
        if isr == state.isr:
            # The set in force may still be the union of an earlier write whose answer was lost
            # (a timeout, yet ZooKeeper committed it): count whom ZooKeeper lists, or every
            # SYNC send waits for a slave that left.
            self.hooks.set_isr(isr)
            return
        # Joiners count for acknowledgements before the write; leavers stop after it.
        self.hooks.set_isr(state.isr | isr)
        new = GroupState(state.epoch, state.master_id, isr)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self.znodes.set_state, client, new, version
            )
        except BadVersionError:
            return  # someone else wrote the state: the next read shows whom
        self.hooks.set_isr(isr)
        log.info("in-sync set of epoch %d: %s -> %s", state.epoch, sorted(state.isr), sorted(isr))

    async def _step_down(self, reason: str) -> None:
        log.warning("stepping down: %s", reason)
        self._switching = False
        self._gone_since = None
        await self.hooks.step_down(reason)

    # -- followers --------------------------------------------------------------------------

    async def _as_follower(self, client: Any, view: GroupView, received: int) -> None:
        role = self.role
        state, leader = view.state, view.leader
        if leader is not None:
            if self._gone_since is not None and leader.broker_id != role.own_id:
                self.elections["lost"] += 1  # the group was masterless here; another won
            self._gone_since = None
            self.waiting_reason = ""
            if state is None or leader.epoch != state.epoch:
                return  # a transaction always writes both: a torn view, read again
            if leader.broker_id == role.own_id:
                if view.leader_owner == client.client_id[0]:
                    # This very session won an election whose answer was lost (a timeout,
                    # yet ZooKeeper committed it): nobody else will ever delete the znode.
                    # Let go; the next election waits out a lease as any other does.
                    log.warning("won epoch %d without hearing so: letting it go", leader.epoch)
                    await self.release(client)
                    return
                # Our previous process's session, not yet expired: wait for it to go.
                self.waiting_reason = "this broker's previous session still holds the leader"
                return
            if (role.master_id, role.epoch) != (leader.broker_id, leader.epoch):
                await self.hooks.follow(leader)
            return
        if self._gone_since is None:
            self._gone_since = received
            if role.master_id >= 0:
                log.warning("the master of epoch %d is gone", role.epoch)
            role.master_id = -1
        s = self.settings
        elected = should_elect_self(
            role.own_id,
            state,
            view.candidates,
            s.unclean,
            received - self._gone_since,
            s.settle_ms,
        )
        if elected is None:
            self.waiting_reason = self._why_waiting(state, view.candidates)
            return
        handed_over = state is not None and state.preferred == role.own_id
        # A handover's old master stopped acknowledging before it let go: no lease to wait out.
        gone_seen = received - role.lease_ms if handed_over else self._gone_since
        sent = monotonic_ms()
        leader = zn.Leader(elected.state.master_id, elected.state.epoch, self.settings.ha_address)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self.znodes.elect, client, state, view.state_version, elected.state, leader
            )
        except (BadVersionError, NodeExistsError, NoNodeError) as e:
            log.info("lost the election for epoch %d (%s)", elected.state.epoch, type(e).__name__)
            return
        self._leader_session = client.client_id[0]
        self._gone_since = None
        self.waiting_reason = ""
        log.warning("elected master of %s at epoch %d", self.paths.base, elected.state.epoch)
        try:
            await self.hooks.take_over(elected.state, sent, gone_seen)
        except Exception:
            self.elections["take_over_failed"] += 1
            log.exception("taking over failed; letting go of the leadership")
            await self.release(client)
            await self._step_down("taking over failed")
        else:
            self.elections["won"] += 1

    def masterless_s(self, now_ms: int) -> float:
        """How long this broker has seen its group without a master; 0 while one is known."""
        since = self._gone_since
        return 0.0 if since is None else max(0, now_ms - since) / 1000

    def _why_waiting(self, state: GroupState | None, candidates: list[Candidate]) -> str:
        if state is None:
            return "first election pending"
        eligible = [c.broker_id for c in candidates if c.broker_id in state.isr]
        if not eligible and not self.settings.unclean:
            return (
                f"no live broker of the in-sync set {sorted(state.isr)} (epoch {state.epoch}); "
                f"unclean election is off"
            )
        return f"election of epoch {state.epoch + 1} pending"

    async def release(self, client: Any) -> None:
        """Delete our leader znode (a switchover, or a take-over that failed)."""
        await asyncio.get_running_loop().run_in_executor(None, self.znodes.delete_leader, client)

    async def resign(self, reason: str) -> None:
        """Leave the group's elections for good (this process's store failed): stop, step down
        if master (no acknowledgement from here on), and delete our leader and candidate znodes,
        so an in-sync slave is elected now rather than after the session expires, and this
        broker is never elected again. ZooKeeper errors are logged: the session's end, when
        the broker closes it, removes both znodes anyway."""
        await self.stop()
        was_master = self.role.is_master
        if was_master:
            await self._step_down(reason)
        client = self._get_client()
        if client is None or client.client_id is None:
            return
        loop = asyncio.get_running_loop()
        for path in ((self.paths.leader,) if was_master else ()) + (
            self.paths.candidate(self.role.own_id),
        ):
            try:
                if await loop.run_in_executor(None, self.znodes.delete_own, client, path):
                    log.warning("resigned: deleted %s", path)
            except ZK_ERRORS as e:
                log.warning(
                    "resigning: deleting %s failed (%s); the session's end removes it", path, e
                )

    # -- switchover -------------------------------------------------------------------------

    async def hand_over(self, target: int) -> GroupState:
        """Planned: the caller has stopped acknowledging writes and the target holds every
        byte. Names the target ``preferred`` and lets go of the leader znode, in one
        transaction at our epoch; returns the state written."""
        client = self._get_client()
        loop = asyncio.get_running_loop()
        view = await loop.run_in_executor(None, self.znodes.read, client, False, self._watch)
        state = view.state
        if state is None or state.epoch != self.role.epoch or state.master_id != self.role.own_id:
            raise BadVersionError(f"not the master of epoch {self.role.epoch}")
        self._switching = True
        new = GroupState(state.epoch, state.master_id, state.isr, preferred=target)
        try:
            await loop.run_in_executor(None, self.znodes.hand_over, client, new, view.state_version)
        except Exception:
            self._switching = False
            raise
        await self._step_down(f"handed the group over to broker {target}")
        return new
