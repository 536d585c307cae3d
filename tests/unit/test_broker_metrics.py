"""The broker's scrape-time collectors without a broker: per-queue consumer offsets and lag
(``metrics_state``) over stand-in state, and the role, epoch and election series
(``metrics_failover``) over a real ``RoleState`` and a failover agent whose ZooKeeper calls and
broker hooks are stand-ins (as ``test_failover_agent``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError
from prometheus_client import CollectorRegistry

from tidemq.replication.election import Candidate, GroupState
from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.failover import FailoverAgent, FailoverSettings
from tidemq.services.broker.failover_zk import GroupView
from tidemq.services.broker.failover_znodes import GroupPaths, Leader
from tidemq.services.broker.metrics_failover import FailoverCollector
from tidemq.services.broker.metrics_state import StateCollector
from tidemq.services.broker.role import RoleState
from tidemq.services.broker.topics import TopicConfig
from tidemq.storage.answers import StoreStats

pytestmark = pytest.mark.unit

SESSION = 0x77


def state_registry(
    max_offsets: dict[tuple[str, int], int],
    table: dict[str, dict[int, int]],
    series_max: int = 20_000,
) -> CollectorRegistry:
    """A registry whose StateCollector reads these queue ends and this offset table."""
    topics = sorted({t for t, _ in max_offsets})
    queues = {t: max(q for tt, q in max_offsets if tt == t) + 1 for t in topics}
    configs = {t: TopicConfig(t, queues[t], queues[t]) for t in topics}
    store = SimpleNamespace(
        topics=lambda: {t: sorted(q for tt, q in max_offsets if tt == t) for t in topics},
        stats=lambda: StoreStats(0, 0, 0, 0, 0.0, True, len(max_offsets)),
        failure=None,
        dispatch_stalled=False,
        max_offset=lambda t, q: max_offsets[t, q],
        min_offset=lambda t, q: 0,
    )
    collector = StateCollector(
        SimpleNamespace(
            cluster="c",
            broker_name="b",
            broker_id=0,
            role=BrokerRole.ASYNC_MASTER,
            advertised="h:1",
            metrics_queue_series_max=series_max,
        ),  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SimpleNamespace(topics=configs, get=configs.get),  # type: ignore[arg-type]
        SimpleNamespace(groups={}, expiry_ms=1000),  # type: ignore[arg-type]
        SimpleNamespace(table=table),  # type: ignore[arg-type]
        SimpleNamespace(groups={}),  # type: ignore[arg-type]
        lambda: SimpleNamespace(confirmed_offset=0, slaves=[]),
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_per_queue_offset_and_lag_are_committed_and_end_minus_committed_never_negative() -> None:
    r = state_registry(
        {("orders", 0): 10, ("orders", 1): 4},
        # Queue 1 committed past its end (a slave's copy of offsets, a truncated log): lag 0.
        {"orders@billing": {0: 7, 1: 6}},
    )

    def get(name: str, q: int) -> float | None:
        labels = {"group": "billing", "topic": "orders", "queue_id": str(q)}
        value: float | None = r.get_sample_value(name, labels)
        return value

    assert get("tidemq_consumer_offset", 0) == 7
    assert get("tidemq_consumer_offset", 1) == 6
    assert get("tidemq_consumer_queue_lag_messages", 0) == 3
    assert get("tidemq_consumer_queue_lag_messages", 1) == 0
    summed = r.get_sample_value(
        "tidemq_consumer_lag_messages", {"group": "billing", "topic": "orders"}
    )
    assert summed == 3


def test_per_queue_series_name_only_queues_of_existing_topics() -> None:
    r = state_registry(
        {("orders", 0): 5},
        # A deleted topic's offsets, a queue the topic no longer has, and a %SYS% log's key:
        # history, not series.
        {"gone@billing": {0: 1}, "orders@billing": {0: 2, 3: 1}, "%SYS%RECEIVE_LOG@x": {0: 0}},
    )
    queue_series = [
        s.labels
        for m in r.collect()
        if m.name in ("tidemq_consumer_offset", "tidemq_consumer_queue_lag_messages")
        for s in m.samples
    ]
    assert queue_series == [{"group": "billing", "topic": "orders", "queue_id": "0"}] * 2


def test_past_the_series_limit_the_queues_furthest_behind_are_shown_and_the_rest_counted() -> None:
    ends = {("orders", q): 100 for q in range(5)}
    committed = {0: 100, 1: 10, 2: 90, 3: 50, 4: 0}  # behind: 0, 90, 10, 50, 100
    r = state_registry(ends, {"orders@billing": committed}, series_max=2)
    queue_ends = [
        s.labels["queue_id"]
        for m in r.collect()
        if m.name == "tidemq_queue_max_offset"
        for s in m.samples
    ]
    assert len(queue_ends) == 2
    lagging = {
        s.labels["queue_id"]: s.value
        for m in r.collect()
        if m.name == "tidemq_consumer_queue_lag_messages"
        for s in m.samples
    }
    assert lagging == {"4": 100, "1": 90}
    omitted = "tidemq_metrics_queue_series_omitted"
    assert r.get_sample_value(omitted, {"kind": "queue"}) == 3
    assert r.get_sample_value(omitted, {"kind": "consumer_queue"}) == 3
    # The sums per group and topic are never cut.
    summed = r.get_sample_value(
        "tidemq_consumer_lag_messages", {"group": "billing", "topic": "orders"}
    )
    assert summed == 250


# -- role, epoch and elections -------------------------------------------------------------


@dataclass
class Client:
    client_id: tuple[int, bytes] = (SESSION, b"")
    connected: bool = True


@dataclass
class Znodes:
    """The election write: succeeds, or loses the version race."""

    lose: bool = False
    calls: list[str] = field(default_factory=list)

    def elect(self, client: Any, old: Any, version: int, new: GroupState, leader: Any) -> None:
        self.calls.append(f"elect {new.epoch}")
        if self.lose:
            raise BadVersionError()

    def delete_leader(self, client: Any) -> None:
        self.calls.append("delete_leader")


@dataclass
class Hooks:
    """The broker side of a take-over: promotes the role, or fails."""

    role: RoleState
    fail: bool = False

    async def take_over(self, state: GroupState, sent_ms: int, gone_seen_ms: int) -> None:
        if self.fail:
            raise RuntimeError("store refused the epoch")
        self.role.promote(state.epoch, sent_ms, gone_seen_ms)

    async def step_down(self, reason: str) -> None:
        self.role.demote(self.role.epoch, -1)

    async def follow(self, leader: Leader) -> None:
        self.role.demote(leader.epoch, leader.broker_id)


def failover(broker_id: int = 2) -> tuple[FailoverAgent, RoleState, Hooks, Znodes, Any]:
    role = RoleState.for_config(BrokerRole.SYNC_MASTER, broker_id, True, 1000)
    hooks = Hooks(role)
    settings = FailoverSettings(0, False, 4000, 500, "b:1", "b:1")
    agent = FailoverAgent(Client, GroupPaths.of("/t", "c", "g"), role, settings, hooks)  # type: ignore[arg-type]
    znodes = Znodes()
    agent.znodes = znodes  # type: ignore[assignment]
    registry = CollectorRegistry()
    registry.register(FailoverCollector(role, agent))
    return agent, role, hooks, znodes, registry


def masterless(epoch: int, *candidates: int) -> GroupView:
    """Epoch ``epoch``'s master (broker 1) is gone; ``candidates`` are live, all in sync."""
    isr = frozenset({1, *candidates})
    return GroupView(
        GroupState(epoch, 1, isr), 5, None, 0, [Candidate(c, epoch, 100, 0) for c in candidates]
    )


def led_by(broker_id: int, epoch: int) -> GroupView:
    state = GroupState(epoch, broker_id, frozenset({broker_id}))
    return GroupView(state, 6, Leader(broker_id, epoch, "b:9"), SESSION + 1, [])


def elections(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        o: registry.get_sample_value("tidemq_failover_elections_total", {"outcome": o})
        for o in ("won", "lost", "take_over_failed")
    }


def test_a_broker_that_sees_another_elected_counts_a_lost_election_and_a_master_again() -> None:
    agent, role, _, _, r = failover(broker_id=3)
    asyncio.run(agent._as_follower(Client(), led_by(1, 1), 1_000))
    assert elections(r) == {"won": 0, "lost": 0, "take_over_failed": 0}  # joined, no election
    # Broker 2 outranks 3 (lower id, same log): 3 waits, masterless, and 2 takes over.
    asyncio.run(agent._as_follower(Client(), masterless(1, 2, 3), 2_000))
    assert agent.masterless_s(3_500) == 1.5
    asyncio.run(agent._as_follower(Client(), led_by(2, 2), 3_000))
    assert elections(r) == {"won": 0, "lost": 1, "take_over_failed": 0}
    assert r.get_sample_value("tidemq_failover_master_absent_seconds") == 0
    assert r.get_sample_value("tidemq_broker_epoch") == 2
    assert r.get_sample_value("tidemq_broker_role", {"role": "SLAVE"}) == 1
    assert r.get_sample_value("tidemq_broker_role", {"role": "SYNC_MASTER"}) == 0
    assert role.master_id == 2


def test_a_broker_that_wins_counts_won_and_reports_the_new_epoch_and_its_master_role() -> None:
    agent, _, _, znodes, r = failover(broker_id=2)
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_000))
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_600))  # settled: elects
    assert znodes.calls == ["elect 5"]
    assert elections(r) == {"won": 1, "lost": 0, "take_over_failed": 0}
    assert r.get_sample_value("tidemq_broker_epoch") == 5
    assert r.get_sample_value("tidemq_broker_role", {"role": "SYNC_MASTER"}) == 1
    assert r.get_sample_value("tidemq_failover_master_absent_seconds") == 0


def test_a_lost_election_race_counts_once_when_the_winner_shows_up() -> None:
    agent, _, _, znodes, r = failover(broker_id=2)
    znodes.lose = True
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_000))
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_600))
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_700))
    assert znodes.calls == ["elect 5", "elect 5"]
    assert elections(r)["lost"] == 0  # nobody is master yet: the election is not over
    asyncio.run(agent._as_follower(Client(), led_by(3, 5), 10_800))
    assert elections(r) == {"won": 0, "lost": 1, "take_over_failed": 0}


def test_a_take_over_that_fails_counts_as_such_and_not_as_won() -> None:
    agent, role, hooks, znodes, r = failover(broker_id=2)
    hooks.fail = True
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_000))
    asyncio.run(agent._as_follower(Client(), masterless(4, 2, 3), 10_600))
    assert znodes.calls == ["elect 5", "delete_leader"]
    assert elections(r) == {"won": 0, "lost": 0, "take_over_failed": 1}
    assert not role.is_master


def test_a_classic_broker_shows_its_role_and_epoch_zero_and_no_election_samples() -> None:
    role = RoleState.for_config(BrokerRole.ASYNC_MASTER, 0, False, 0)
    r = CollectorRegistry()
    r.register(FailoverCollector(role, None))
    assert r.get_sample_value("tidemq_broker_epoch") == 0
    assert r.get_sample_value("tidemq_broker_role", {"role": "ASYNC_MASTER"}) == 1
    assert r.get_sample_value("tidemq_broker_acknowledging_writes") == 1
    failover = {"tidemq_failover_elections", "tidemq_failover_master_absent_seconds"}
    families = {m.name: m.samples for m in r.collect() if m.name in failover}
    assert families == {name: [] for name in failover}  # named, for queries; no values
