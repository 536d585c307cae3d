"""A broker's role changes under automatic failover: what taking over, stepping down and
following a new master do to its parts (replication master and slave sides, config sync,
registration), plus status and planned switchover. The agent (``failover``) decides when.

Taking over (RocketMQ's ``changeToMaster``, spec §5.4): stop the slave side, cut a record the
old master's stream left half-received, append ``(epoch, max offset)`` to the epoch file, start a
mastership with the ISR the election wrote, and register as the group's id 0 at the new epoch.
Stepping down: stop acknowledging first (the role), then end the mastership (links close, SYNC
sends still waiting are answered unacknowledged). Following: the slave side replicates from the
named master and truncates whatever the two epoch files say this log does not share with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.replication.election import GroupState, ReplicaView
from tidemq.replication.epochs import EpochFile
from tidemq.replication.master_link import ReplicationServicer
from tidemq.replication.slave_link import SlaveClient
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.config_sync import ConfigSync
from tidemq.services.broker.failover import FailoverAgent, FailoverSettings
from tidemq.services.broker.failover_znodes import GroupPaths, Leader
from tidemq.services.broker.limits import LimitExceededError
from tidemq.services.broker.receive.dead_letter import is_system_topic
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.services.errors import ServiceError
from tidemq.storage import MessageStore
from tidemq.storage.clock import monotonic_ms

log = logging.getLogger(__name__)

# How long a switchover waits for its target to hold every byte, then for it to take over.
SWITCHOVER_CATCH_UP_S = 5.0
SWITCHOVER_TAKE_OVER_S = 10.0


class AutomaticFailover:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        role: RoleState,
        master: ReplicationServicer,
        slave: SlaveClient,
        config_sync: ConfigSync,
        zk_client: Callable[[], Any],
        on_role_changed: Callable[[], object],
        topics: TopicManager,
    ) -> None:
        self.config = config
        self.store = store
        self.role = role
        self.master = master
        self.slave = slave
        self.config_sync = config_sync
        self.on_role_changed = on_role_changed
        self.topics = topics
        self.epochs = EpochFile(config.store_dir)
        slave.epochs = self.epochs
        master.active = False
        self._epoch_start = 0
        self._following: list[asyncio.Task[None]] = []
        self.agent = FailoverAgent(
            zk_client,
            GroupPaths.of(config.zk_root, config.cluster, config.broker_name),
            role,
            FailoverSettings(
                priority=config.election_priority,
                unclean=config.unclean_election,
                isr_max_lag_ms=config.isr_max_lag_ms,
                settle_ms=config.election_settle_ms,
                address=config.advertised,
                ha_address=config.advertised,
            ),
            self,
        )

    def start(self) -> None:
        self.agent.start()

    async def stop(self) -> None:
        await self.agent.stop()
        await self._stop_following()
        if self.role.is_master:
            self.role.demote(self.role.epoch, -1)
            self.master.end_mastership()

    async def resign(self, reason: str) -> None:
        """Out of the group's elections until restarted (the store failed): no acknowledgement,
        no replication from a master, leader and candidate znodes deleted."""
        await self.agent.resign(reason)
        await self._stop_following()

    # -- hooks the agent calls ----------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        self.epochs.truncate_before(self.store.log.min_offset)
        return self.epochs.last_epoch, self.store.log.max_offset

    async def take_over(self, state: GroupState, sent_ms: int, gone_seen_ms: int) -> None:
        await self._stop_following()
        store = self.store
        cut = await asyncio.to_thread(
            store.cut_partial_tail, "taking over: a record half-received from the old master"
        )
        if cut:
            log.warning("taking over: cut %d bytes of a half-received record", cut)
        self._restore_topics()
        start = store.log.max_offset
        await asyncio.to_thread(self.epochs.append, state.epoch, start)
        self._epoch_start = start
        self.master.begin_mastership(state.epoch, self.epochs, state.isr, self.slave.confirm_offset)
        self.role.promote(state.epoch, sent_ms, gone_seen_ms)
        log.warning(
            "master of %s at epoch %d from offset %d; acknowledging writes in %d ms",
            self.config.broker_name,
            state.epoch,
            start,
            max(0, self.role.ack_from_ms - monotonic_ms()),
        )
        self.on_role_changed()

    def _restore_topics(self) -> None:
        """Topic configs travel by config sync (every few seconds), messages by replication:
        a topic created just before the old master died may have messages here but no config.
        Rebuilt from the queues the store holds, so its route does not vanish with the old
        master (the queue count is the highest queue seen; an operator may widen it)."""
        for topic, queue_ids in self.store.topics().items():
            # The broker's own logs (%SYS%RECEIVE_LOG) have queues but are no topic.
            if self.topics.get(topic) is None and not is_system_topic(topic):
                n = max(queue_ids) + 1
                # LimitExceededError: this broker's max_topics is below what its master held.
                with contextlib.suppress(ValueError, LimitExceededError):
                    self.topics.upsert(TopicConfig(topic, n, n))
                    log.warning(
                        "topic %s had messages but no config here (created after the last "
                        "config sync): restored with %d queues",
                        topic,
                        n,
                    )

    async def step_down(self, reason: str) -> None:
        was_master = self.role.is_master
        self.role.demote(self.role.epoch, -1)  # first: not one more acknowledgement
        if was_master:
            self.master.end_mastership()
            self.on_role_changed()

    async def follow(self, leader: Leader) -> None:
        if self.role.is_master:
            await self.step_down(f"broker {leader.broker_id} is master of epoch {leader.epoch}")
        self.role.demote(leader.epoch, leader.broker_id)
        log.info(
            "following broker %d at %s (epoch %d)", leader.broker_id, leader.address, leader.epoch
        )
        self.slave.set_master(leader.address, leader.epoch)
        self.config_sync.set_master(leader.address)
        if not self._following:
            self._following = [
                asyncio.create_task(self.slave.run(), name="replication-slave"),
                asyncio.create_task(self.config_sync.run(), name="config-sync"),
            ]
        self.on_role_changed()

    def replica_views(self) -> dict[int, ReplicaView]:
        return self.master.tracker.replica_views()

    def epoch_start_offset(self) -> int:
        return self._epoch_start

    def set_isr(self, isr: frozenset[int]) -> None:
        self.master.set_isr(isr)

    async def _stop_following(self) -> None:
        tasks, self._following = self._following, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    # -- what the Broker service exposes -----------------------------------------------------

    def log_epoch(self) -> int:
        """The epoch of the newest entry in this broker's epoch list (pull answers carry it)."""
        return self.epochs.last_epoch

    def confirm_cap(self) -> int | None:
        """Under confirm_offset: what consumers of this broker may see."""
        if not self.role.is_master:
            return self.slave.confirm_offset
        isr = self.master.tracker.isr
        if isr is not None and len(isr) <= 1 and not self.config.unclean_election:
            # Alone in the ISR: no other broker may be elected, so nothing of its log can be
            # taken back by a failover. (With unclean election one may: then consumers see only
            # what the slaves last held.)
            return None
        return self.master.confirmed_offset

    def status(self) -> Any:
        view = self.agent.view
        st = broker_pb2.FailoverStatus(
            mode="auto",
            role=self.role.role.value,
            local_epoch=self.epochs.last_epoch,
            acknowledging=self.role.may_acknowledge(),
            priority=self.config.election_priority,
            master_id=-1,
            waiting_reason=self.agent.waiting_reason,
        )
        if view is not None and view.state is not None:
            st.group_epoch = view.state.epoch
            st.isr.extend(sorted(view.state.isr))
            if view.leader is not None:
                st.master_id = view.leader.broker_id
        return st

    async def switchover(self, target: int) -> Any:
        """Hand mastership to ``target``: stop acknowledging, wait until it holds every byte,
        then name it preferred and let go; it takes over at once, without a lease to wait out."""
        if target == self.role.own_id:
            raise _refused(f"broker {target} is already the master", common_pb2.INVALID_ARGUMENT)
        isr = self.master.tracker.isr or frozenset()
        if target not in isr:
            raise _refused(
                f"broker {target} is not in the in-sync set {sorted(isr)}",
                common_pb2.INVALID_ARGUMENT,
            )
        paused = monotonic_ms()
        self.role.paused = True
        try:
            end = self.store.log.max_offset
            if not await self._caught_up(target, end):
                raise _refused(
                    f"broker {target} did not catch up to {end} within "
                    f"{SWITCHOVER_CATCH_UP_S:.0f} s",
                    common_pb2.BROKER_BUSY,
                    retriable=True,
                )
            state = await self.agent.hand_over(target)
        finally:
            self.role.paused = False
        taken = await self._taken_over(target, state.epoch)
        return broker_pb2.SwitchoverResponse(
            epoch=taken, master_id=target, writes_paused_ms=monotonic_ms() - paused
        )

    async def _caught_up(self, target: int, end: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SWITCHOVER_CATCH_UP_S
        self.master.notify_appended()
        while self.master.tracker.acked_by_broker.get(target, 0) < end:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def _taken_over(self, target: int, old_epoch: int) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SWITCHOVER_TAKE_OVER_S
        while loop.time() < deadline:
            self.agent.wake()
            await asyncio.sleep(0.02)
            view = self.agent.view
            if (
                view is not None
                and view.leader is not None
                and view.leader.broker_id == target
                and view.leader.epoch > old_epoch
            ):
                return view.leader.epoch
        raise _refused(
            f"broker {target} did not take over within {SWITCHOVER_TAKE_OVER_S:.0f} s; the "
            f"group elects a master on its own",
            common_pb2.BROKER_BUSY,
            retriable=True,
        )


def _refused(message: str, code: int, retriable: bool = False) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, code, message, retriable=retriable)
