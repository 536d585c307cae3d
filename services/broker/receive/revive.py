"""The receive state's housekeeping, every ``revive_interval_ms`` (RocketMQ's PopReviveService):
on the master, messages that used up their deliveries go to the dead-letter queue, and every
receive group's floor is committed as its consumer offset (so lag, config sync and retention see
receive groups as they see offset groups); on every broker, a snapshot of the state every
``receive_snapshot_interval_ms`` when it changed."""

from __future__ import annotations

import asyncio
import logging

from tidemq.services.broker.groups import GroupSettings, SubscriptionGroupManager
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.receive.dead_letter import max_attempts_reason
from tidemq.services.broker.receive.journal import ReceiveJournal
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.receive.settle import Settlement
from tidemq.services.broker.role import RoleState
from tidemq.storage.clock import monotonic_ms, now_ms

log = logging.getLogger(__name__)


class Reviver:
    def __init__(
        self,
        service: ReceiveService,
        settle: Settlement,
        journal: ReceiveJournal,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        role: RoleState,
        snapshot_interval_ms: int,
    ) -> None:
        self.service = service
        self.settle = settle
        self.journal = journal
        self.groups = groups
        self.offsets = offsets
        self.role = role
        self.snapshot_interval_ms = snapshot_interval_ms
        self._last_snapshot_ms = monotonic_ms()

    async def tick(self) -> None:
        if self.service.checks.shutting_down:
            return
        if self.role.is_master and self.role.may_acknowledge():
            await self.service.lead()
            await self.dead_letter_exhausted()
            self.commit_floors()
        if monotonic_ms() - self._last_snapshot_ms >= self.snapshot_interval_ms:
            await self.snapshot()

    async def dead_letter_exhausted(self) -> None:
        now = now_ms()
        for key, q in self.journal.states:
            g = self.groups.get(key.group)
            s = g.settings if g is not None else GroupSettings()
            dead = q.dead_candidates(now, s.max_delivery_attempts, s.retry_policy)
            if dead:
                await self.settle.dead_letter_offsets(
                    key, [o for o, _ in dead], max_attempts_reason(s.max_delivery_attempts)
                )

    def commit_floors(self) -> None:
        """A receive group's floor is its committed offset; a reset (the floor moved back)
        commits as one."""
        for key, q in self.journal.states:
            current = self.offsets.query(key.group, key.topic, key.queue_id)
            if current == q.floor:
                continue
            reset = current is not None and q.floor < current
            self.offsets.commit(key.group, key.topic, key.queue_id, q.floor, reset=reset)

    async def snapshot(self) -> None:
        """Encoded on the loop (a consistent state), written in an executor."""
        self._last_snapshot_ms = monotonic_ms()
        got = self.journal.snapshot_bytes()
        if got is None:
            return
        position, data = got
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self.journal.write_snapshot, position, data
            )
        except OSError:
            self.journal.changed = True  # the next round tries again
            raise
