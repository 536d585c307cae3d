"""The failover agent's answers to a ZooKeeper answer it never heard (a write that timed out
but was committed), without ZooKeeper: the agent reads a view and acts; its client, znode calls
and broker hooks are stand-ins that record what it did. The same cases run against real
processes, with the answer really lost, in ``tests/integration/test_partitions.py``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from tidemq.replication.election import GroupState, ReplicaView
from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.failover import FailoverAgent, FailoverSettings
from tidemq.services.broker.failover_zk import GroupView
from tidemq.services.broker.failover_znodes import GroupPaths, Leader
from tidemq.services.broker.role import RoleState
from tidemq.storage.clock import monotonic_ms

pytestmark = pytest.mark.unit

SESSION = 0x51


@dataclass
class Client:
    client_id: tuple[int, bytes] = (SESSION, b"")
    connected: bool = True


@dataclass
class Znodes:
    """The agent's ZooKeeper calls, recorded."""

    calls: list[str] = field(default_factory=list)

    def set_state(self, client: Any, state: GroupState, version: int) -> None:
        self.calls.append(f"set_state {sorted(state.isr)}")

    def delete_leader(self, client: Any) -> None:
        self.calls.append("delete_leader")


@dataclass
class Hooks:
    isr: frozenset[int]
    replicas: dict[int, ReplicaView] = field(default_factory=dict)

    def replica_views(self) -> dict[int, ReplicaView]:
        return self.replicas

    def epoch_start_offset(self) -> int:
        return 0

    def set_isr(self, isr: frozenset[int]) -> None:
        self.isr = isr


def agent(role: RoleState, hooks: Hooks) -> tuple[FailoverAgent, Znodes]:
    settings = FailoverSettings(0, False, 4000, 500, "b:1", "b:1")
    a = FailoverAgent(Client, GroupPaths.of("/t", "c", "g"), role, settings, hooks)  # type: ignore[arg-type]
    znodes = Znodes()
    a.znodes = znodes  # type: ignore[assignment]
    return a, znodes


def test_a_master_counts_the_in_sync_set_zookeeper_holds_after_a_write_it_never_heard_of() -> None:
    """It dropped slave 3 (the union {1, 2, 3} stayed in force while it wrote {1, 2}); the
    write timed out but ZooKeeper holds {1, 2}. At the next read nothing is left to write, and
    the set in force must become {1, 2}, or every SYNC send waits for slave 3."""
    role = RoleState.for_config(BrokerRole.SYNC_MASTER, 1, True, 1000)
    role.promote(1, monotonic_ms(), monotonic_ms())
    now = monotonic_ms()
    hooks = Hooks(
        frozenset({1, 2, 3}),
        {
            2: ReplicaView(2, True, 100, now),
            3: ReplicaView(3, False, 50, now - 60_000),
        },
    )
    a, znodes = agent(role, hooks)
    asyncio.run(a._maintain_isr(Client(), GroupState(1, 1, frozenset({1, 2})), 7))
    assert znodes.calls == []
    assert hooks.isr == {1, 2}


def test_a_broker_whose_own_session_holds_the_leader_znode_lets_it_go() -> None:
    """It won epoch 2 without hearing so: the leader znode is its current session's, so nobody
    else will ever delete it. It deletes it (the group elects again) rather than wait."""
    role = RoleState.for_config(BrokerRole.SYNC_MASTER, 2, True, 1000)
    a, znodes = agent(role, Hooks(frozenset()))
    view = GroupView(GroupState(2, 2, frozenset({2})), 3, Leader(2, 2, "b:1"), SESSION, [])
    asyncio.run(a._as_follower(Client(), view, monotonic_ms()))
    assert znodes.calls == ["delete_leader"]
    assert not role.is_master


def test_a_broker_waits_for_a_leader_znode_an_earlier_process_of_its_own_holds() -> None:
    """The same broker id, another session (this broker's process before a restart): that
    session expires on its own, and only then may the group elect."""
    role = RoleState.for_config(BrokerRole.SYNC_MASTER, 2, True, 1000)
    a, znodes = agent(role, Hooks(frozenset()))
    view = GroupView(GroupState(2, 2, frozenset({2})), 3, Leader(2, 2, "b:1"), SESSION + 1, [])
    asyncio.run(a._as_follower(Client(), view, monotonic_ms()))
    assert znodes.calls == []
    assert a.waiting_reason == "this broker's previous session still holds the leader"
