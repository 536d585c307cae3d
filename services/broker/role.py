"""What a broker is right now: master or slave, under which epoch, and whether it may
acknowledge writes.

A classic broker's role is its configuration for life. Under automatic failover the failover
agent moves it: a broker starts as a candidate (a slave that follows nobody yet), becomes
master when elected, and steps down to slave when it loses its ZooKeeper lease or sees a newer
epoch.

The lease is what keeps two brokers from acknowledging writes at once. A master may acknowledge
only until ``lease_ms`` after the *send* time of its last ZooKeeper round trip that found its
leader znode still its own. ZooKeeper cannot expire the session sooner than a session timeout
after hearing that request, and a successor waits ``lease_ms`` after seeing the old leader znode
go before it acknowledges anything, so the two windows never overlap: not after a network
partition, not after a SIGSTOP (the monotonic clock runs on while the process is stopped, so a
resumed master finds its lease long past).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidemq.services.broker.config import BrokerRole
from tidemq.storage.clock import monotonic_ms


class Mode(enum.Enum):
    CLASSIC = "classic"
    AUTO = "auto"


@dataclass
class RoleState:
    mode: Mode
    own_id: int
    # The master kind this broker acts as when master (ASYNC_MASTER or SYNC_MASTER); a
    # classic slave's is SLAVE.
    master_kind: BrokerRole
    role: BrokerRole
    epoch: int = 0
    lease_ms: int = 0
    # Monotonic ms until which a master under automatic failover may acknowledge writes; it also
    # may not before ``ack_from_ms`` (a successor waiting out its predecessor's lease).
    lease_until_ms: int = 0
    ack_from_ms: int = 0
    # The group's master as last seen (-1: none), for status.
    master_id: int = -1
    # A switchover in progress: the master acknowledges nothing while its target catches up.
    paused: bool = False

    @classmethod
    def for_config(
        cls, role: BrokerRole, broker_id: int, automatic: bool, lease_ms: int
    ) -> RoleState:
        if not automatic:
            return cls(Mode.CLASSIC, broker_id, role, role)
        return cls(Mode.AUTO, broker_id, role, BrokerRole.SLAVE, lease_ms=lease_ms)

    @property
    def automatic(self) -> bool:
        return self.mode is Mode.AUTO

    @property
    def is_master(self) -> bool:
        return self.role is not BrokerRole.SLAVE

    @property
    def registered_id(self) -> int:
        """The id the broker registers under: 0 for the master, as RocketMQ's controller mode
        does, so routes and clients need no notion of automatic failover."""
        return 0 if self.automatic and self.is_master else self.own_id

    def may_acknowledge(self, now_ms: int | None = None) -> bool:
        if not self.is_master or self.paused:
            return False
        if not self.automatic:
            return True
        now = monotonic_ms() if now_ms is None else now_ms
        return self.ack_from_ms <= now < self.lease_until_ms

    def renew(self, sent_ms: int) -> None:
        """A round trip sent at ``sent_ms`` confirmed this broker is still the master."""
        self.lease_until_ms = max(self.lease_until_ms, sent_ms + self.lease_ms)

    def promote(self, epoch: int, sent_ms: int, gone_seen_ms: int) -> None:
        """Elected at ``epoch`` by a write sent at ``sent_ms``; the predecessor was last seen
        alive (its leader znode present) at ``gone_seen_ms``."""
        self.role = self.master_kind
        self.epoch = epoch
        self.master_id = self.own_id
        self.lease_until_ms = sent_ms + self.lease_ms
        self.ack_from_ms = gone_seen_ms + self.lease_ms

    def demote(self, epoch: int, master_id: int) -> None:
        self.role = BrokerRole.SLAVE
        self.epoch = max(self.epoch, epoch)
        self.master_id = master_id
        self.lease_until_ms = 0
        self.ack_from_ms = 0
