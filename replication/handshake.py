"""Who may replicate from this master, and from where: the handshake decision, pure.

A slave says who it is and proves where its log stands (probes of its records, or its epoch
list under automatic failover); the master accepts it from an offset (cutting the slave back
first when their logs diverged, or setting its store aside when retention deleted everything it
would continue from) or refuses it with a reason. No sockets, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tidemq.replication.epochs import EpochEntry, consistent_point
from tidemq.replication.log import LogView, Probe


@dataclass(frozen=True, slots=True)
class Identity:
    cluster: str
    broker_name: str
    broker_id: int


@dataclass(frozen=True, slots=True)
class Handshake:
    """What a slave says first (protos/replication.proto ``Handshake``)."""

    identity: Identity
    commitlog_file_size: int
    empty: bool
    min_offset: int
    max_offset: int
    probes: Sequence[Probe] = ()
    address: str = ""
    # Automatic failover: the epoch the slave means to follow, and its epoch file.
    group_epoch: int = 0
    epochs: Sequence[EpochEntry] = ()


class RefusalKind(enum.Enum):
    STRANGER = "stranger"  # another cluster or broker group, or broker id 0
    NOT_MASTER = "not_master"  # the callee does not serve replication
    INCOMPATIBLE = "incompatible"  # a store layout the two logs cannot share
    PROTOCOL = "protocol"  # a malformed or out-of-order message
    NO_COMMON_HISTORY = "no_common_history"  # nothing the master still holds can continue it
    STALE_EPOCH = "stale_epoch"  # the callee is a master an election has superseded


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: RefusalKind
    reason: str
    master_min_offset: int = 0
    master_max_offset: int = 0


@dataclass(frozen=True, slots=True)
class Accept:
    start_offset: int
    truncate: bool
    reason: str
    master_min_offset: int
    master_max_offset: int
    # The slave's log ends below everything the master still holds: it sets its store aside and
    # starts again empty at ``start_offset`` (on the wire: a start past the slave's end).
    resync: bool = False


def behind_retention(hs: Handshake, lo: int, hi: int) -> Accept | None:
    """A slave whose log ends below the master's min offset was away while the master's
    retention deleted what it would continue from: nothing it holds can be checked or continued,
    so it resynchronises from the master's oldest file."""
    if hs.empty or hs.max_offset >= lo:
        return None
    return Accept(
        lo,
        False,
        f"slave log ends at {hs.max_offset}, below the master's min offset {lo} (deleted by "
        f"retention): the slave sets its store aside and resynchronises from {lo}",
        lo,
        hi,
        resync=True,
    )


def decide_handshake(
    local: Identity, file_size: int, hs: Handshake, log: LogView
) -> Accept | Refusal:
    """Validate a handshake and choose where the slave's stream starts."""
    them = hs.identity
    if (them.cluster, them.broker_name) != (local.cluster, local.broker_name):
        return Refusal(
            RefusalKind.STRANGER,
            f"broker {them.cluster}/{them.broker_name} is not in this group "
            f"({local.cluster}/{local.broker_name})",
        )
    if them.broker_id <= 0 or them.broker_id == local.broker_id:
        return Refusal(
            RefusalKind.STRANGER,
            f"broker id {them.broker_id} cannot replicate: slaves have ids > 0 and this master "
            f"is {local.broker_id}",
        )
    if hs.commitlog_file_size != file_size:
        return Refusal(
            RefusalKind.INCOMPATIBLE,
            f"slave CommitLog files are {hs.commitlog_file_size} bytes, the master's {file_size}",
        )
    lo, hi = log.min_offset, log.max_offset

    def accept(start: int, reason: str, truncate: bool = False) -> Accept:
        return Accept(start, truncate, reason, lo, hi)

    def no_common(reason: str) -> Refusal:
        return Refusal(RefusalKind.NO_COMMON_HISTORY, reason, lo, hi)

    if hs.empty:
        # The whole retained history, not only the last file (RocketMQ #3661).
        return accept(lo, f"empty slave: from the master's min offset {lo}")
    behind = behind_retention(hs, lo, hi)
    if behind is not None:
        return behind
    if hs.max_offset == hs.min_offset:
        if hs.min_offset == lo:
            return accept(lo, f"slave log is empty at {lo}, the master's min offset")
        return no_common(
            f"slave log is empty at {hs.min_offset} but the master's starts at {lo}; wipe the "
            f"slave's store to replicate from scratch"
        )
    tail = hs.probes[0] if hs.probes else None
    if (
        hs.max_offset <= hi
        and tail is not None
        and tail.offset + tail.length == hs.max_offset
        and log.crc_of(tail.offset, tail.length) == tail.crc32
    ):
        return accept(hs.max_offset, f"slave continues at {hs.max_offset}")
    why = (
        f"slave log ends at {hs.max_offset}, beyond the master's {hi}"
        if hs.max_offset > hi
        else f"slave tail before {hs.max_offset} differs from the master's bytes"
    )
    for p in hs.probes[1:]:
        if log.crc_of(p.offset, p.length) == p.crc32:
            common = p.offset + p.length
            return accept(common, f"{why}; last common offset {common}", truncate=True)
    if hs.min_offset == lo:
        return accept(lo, f"{why}; no record in common, cut back to {lo}", truncate=True)
    return no_common(
        f"{why}, and no record it holds from {hs.min_offset} matches the master's log "
        f"[{lo}, {hi}); wipe the slave's store to replicate from scratch"
    )


def decide_by_epochs(
    hs: Handshake, master_epochs: Sequence[EpochEntry], log: LogView
) -> Accept | Refusal | None:
    """Automatic failover: where a slave continues, from the two epoch files (the last offset
    both logs hold the same bytes to). None when either side has no epochs to compare; the
    caller then compares records (``decide_handshake``)."""
    if hs.empty or not hs.epochs or not master_epochs:
        return None
    lo, hi = log.min_offset, log.max_offset
    behind = behind_retention(hs, lo, hi)
    if behind is not None:
        return behind
    point = consistent_point(hs.epochs, hs.max_offset, master_epochs, hi)
    if point is None:
        return None
    if point < lo:
        return Refusal(
            RefusalKind.NO_COMMON_HISTORY,
            f"the logs part at {point}, below the master's min offset {lo}; wipe the slave's "
            f"store to replicate from scratch",
            lo,
            hi,
        )
    if point >= hs.max_offset:
        return Accept(hs.max_offset, False, f"slave continues at {hs.max_offset} (epochs)", lo, hi)
    return Accept(
        point,
        True,
        f"slave log ends at {hs.max_offset} but shares the master's epochs only up to {point}",
        lo,
        hi,
    )
