"""Automatic failover as pure decisions: who may become master of a broker group, who should,
and how the in-sync replica set (ISR) moves. No ZooKeeper and no clock here: the broker's
failover agent (``tidemq.services.broker.failover``) reads ZooKeeper, passes what it saw and
``now_ms``, and carries the answer out with version-checked writes.

The rules (RocketMQ 5's controller, spec §5.4, with the fixes for its users' reports, §10):

- A group's state is ``(epoch, master, isr)``. Only the master changes the ISR, and only while
  its epoch is the group's; every election raises the epoch.
- Only live ISR members are eligible (unclean election, a setting, widens that to every live
  broker). Among them: the highest last epoch in its own log, then the highest CommitLog
  offset, then the lowest priority number, then the lowest broker id.
- A planned switchover names a ``preferred`` broker: while it is live and eligible it alone may
  take over; the others wait.
- The master acknowledges a SYNC send only once every ISR slave holds it, so each ISR member
  holds every acknowledged message and any of them may succeed the master without a loss.
  A slave leaves the ISR when it has no link or has not caught up for ``isr_max_lag_ms``; it
  rejoins once it has caught up within the master's current epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupState:
    epoch: int
    master_id: int
    isr: frozenset[int]
    preferred: int | None = None  # a switchover's target


@dataclass(frozen=True, slots=True)
class Candidate:
    """A live broker of the group, as its candidate znode last said."""

    broker_id: int
    last_epoch: int  # the newest epoch in its own epoch file
    max_offset: int
    priority: int = 0  # lower wins (RocketMQ's electionPriority)


@dataclass(frozen=True, slots=True)
class Elected:
    winner: int
    state: GroupState  # what the winner writes (epoch + 1, ISR = itself)


@dataclass(frozen=True, slots=True)
class NoneEligible:
    reason: str


def rank_key(c: Candidate) -> tuple[int, int, int, int]:
    return (-c.last_epoch, -c.max_offset, c.priority, c.broker_id)


def eligible(
    state: GroupState | None, candidates: Iterable[Candidate], unclean: bool
) -> list[Candidate]:
    """Live brokers that may take over, best first."""
    live = list(candidates)
    if state is not None and not unclean:
        live = [c for c in live if c.broker_id in state.isr]
    return sorted(live, key=rank_key)


def choose_master(
    state: GroupState | None, candidates: Iterable[Candidate], unclean: bool = False
) -> Elected | NoneEligible:
    """Who takes over a group whose master is gone. ``state`` None: the group's first election
    (every live broker is eligible; the best ranked wins)."""
    live = list(candidates)
    ranked = eligible(state, live, unclean)
    if not ranked:
        if state is None:
            return NoneEligible("no broker of the group is live")
        return NoneEligible(
            f"no live broker is in the in-sync set {sorted(state.isr)} (live: "
            f"{sorted(c.broker_id for c in live)}); unclean election is off"
        )
    winner = ranked[0]
    if state is not None and state.preferred is not None:
        preferred = [c for c in ranked if c.broker_id == state.preferred]
        if preferred:
            winner = preferred[0]
    epoch = state.epoch + 1 if state is not None else 1
    me = winner.broker_id
    return Elected(me, GroupState(epoch, me, frozenset({me})))


def should_elect_self(
    me: int,
    state: GroupState | None,
    candidates: Iterable[Candidate],
    unclean: bool,
    master_gone_for_ms: int,
    settle_ms: int,
) -> Elected | None:
    """The decision a broker of a masterless group makes on its own: take over now, or wait.

    Everyone computes the same ranking from the same znodes, so at most the best ranked tries;
    the version-checked write settles any race. ``settle_ms`` gives the others time to publish
    their final offsets after the master went (a preferred broker need not wait)."""
    choice = choose_master(state, candidates, unclean)
    if not isinstance(choice, Elected) or choice.winner != me:
        return None
    preferred = state is not None and state.preferred == me
    if not preferred and master_gone_for_ms < settle_ms:
        return None
    return choice


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the master knows of one slave for the ISR decision."""

    broker_id: int
    linked: bool  # a live replication link right now
    acked_offset: int
    caught_up_ms: int | None  # last time it held everything sent to it; None: never this epoch


def isr_after(
    state: GroupState,
    replicas: Mapping[int, ReplicaView],
    epoch_start_offset: int,
    now_ms: int,
    max_lag_ms: int,
    join_window_ms: int,
) -> frozenset[int]:
    """The ISR the master should write next (equal to ``state.isr`` when nothing changes).

    Leaves: a member with no link, or not caught up for longer than ``max_lag_ms``.
    Joins: a linked slave that caught up within ``join_window_ms`` and holds bytes of the
    current epoch (so it truncated whatever an older master left it)."""
    isr = set(state.isr)
    for member in list(isr):
        if member == state.master_id:
            continue
        r = replicas.get(member)
        if (
            r is None
            or not r.linked
            or r.caught_up_ms is None
            or now_ms - r.caught_up_ms > max_lag_ms
        ):
            isr.discard(member)
    for r in replicas.values():
        if (
            r.broker_id not in isr
            and r.linked
            and r.caught_up_ms is not None
            and now_ms - r.caught_up_ms <= join_window_ms
            and r.acked_offset >= epoch_start_offset
        ):
            isr.add(r.broker_id)
    isr.add(state.master_id)
    return frozenset(isr)


def confirmed_by_isr(
    master_id: int, isr: Collection[int], acked: Mapping[int, int], master_max_offset: int
) -> int:
    """What every ISR slave holds (the master's own max when it is alone in the set). A member
    with no ack yet holds nothing of this epoch's tail: it pins the offset at 0 until it
    reports, and leaves the set if it never does."""
    offsets = [acked.get(m, 0) for m in isr if m != master_id]
    return min([master_max_offset, *offsets])
