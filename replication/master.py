"""The master side of replication as a pure state machine: per-slave progress, what to send
next, who is in sync and what a quorum of them holds (who may replicate at all is
``handshake``'s). No sockets, no clock: callers pass ``now_ms`` and carry out the returned
actions (``master_link.py`` does, over gRPC).

Per-slave invariant (etcd raft's Progress, with bytes for indexes):
``start_offset <= acked_offset <= sent_offset <= master max offset``. A report beyond what was
sent is a protocol error, not an ack: nothing a slave says can confirm bytes it never received
(RocketMQ #3015, where any 8 bytes on the HA port counted as an ack). Lag is derived
(``master_max - acked_offset``), never stored.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from tidemq.replication.acks import quorum_offset
from tidemq.replication.config import ReplicationConfig
from tidemq.replication.election import ReplicaView, confirmed_by_isr
from tidemq.replication.handshake import Accept


class LinkState(enum.Enum):
    STREAM = "stream"  # accepted; chunks flow
    CLOSED = "closed"  # dropped or replaced by a newer link of the same slave


@dataclass
class SlaveProgress:
    """One slave's link, from its accepted handshake to its end."""

    link_id: int
    broker_id: int
    start_offset: int
    sent_offset: int
    acked_offset: int
    connected_ms: int
    last_heard_ms: int
    last_sent_ms: int
    last_report_ms: int = -1
    # The slave's advertised address (from its handshake), for status and lag reports.
    address: str = ""
    # Store timestamp of the last record the slave has dispatched, as it last reported.
    last_store_timestamp_ms: int = 0
    # Chunks that reached the end of the master's log as it was when they were read, as
    # (end offset, send time): an ack reaching one means the slave held everything there was
    # at that send (RocketMQ's lastMasterMaxOffset rule).
    catch_up_marks: deque[tuple[int, int]] = field(default_factory=deque)
    # When the slave last held everything there was (ISR membership); None: not yet.
    caught_up_ms: int | None = None
    state: LinkState = LinkState.STREAM
    error: str | None = None

    @property
    def in_flight_bytes(self) -> int:
        return self.sent_offset - self.acked_offset

    def lag_bytes(self, master_max_offset: int) -> int:
        return master_max_offset - self.acked_offset

    def lag_seconds(self, master_max_offset: int, master_last_store_timestamp_ms: int) -> float:
        """Store-time distance to the master's newest record; both timestamps are the master's
        (the slave's came with the bytes), so no clock comparison. -1 while unknown (the slave
        has not dispatched a record yet)."""
        if self.acked_offset >= master_max_offset:
            return 0.0
        if self.last_store_timestamp_ms <= 0:
            return -1.0
        return max(0, master_last_store_timestamp_ms - self.last_store_timestamp_ms) / 1000


@dataclass(frozen=True, slots=True)
class SlaveLag:
    """One slave's place, as the lag report, metrics and status show it."""

    broker_id: int
    address: str
    acked_offset: int
    lag_bytes: int
    lag_seconds: float
    in_sync: bool
    connected_ms: int


@dataclass(frozen=True, slots=True)
class Send:
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Wait:
    pass


@dataclass(frozen=True, slots=True)
class Drop:
    reason: str


Action = Send | SendHeartbeat | Wait | Drop


@dataclass
class MasterTracker:
    """Every connected slave's progress. One link per broker id: a reconnecting slave's new link
    replaces its old one (which then drops), so an id never counts twice."""

    config: ReplicationConfig
    file_size: int
    links: dict[int, SlaveProgress] = field(default_factory=dict)  # link id -> progress
    # Automatic failover: the ISR in force (the master's own id included) and this broker's
    # id; None in classic master/slave, where lag alone decides who is in sync.
    isr: frozenset[int] | None = None
    master_id: int = 0
    # Last offset each slave acknowledged, kept across its reconnections: an ISR member that
    # lost its link still holds what it acknowledged.
    acked_by_broker: dict[int, int] = field(default_factory=dict)
    _by_broker: dict[int, int] = field(default_factory=dict)  # broker id -> link id
    _next_link: int = 1

    def connect(
        self, broker_id: int, accepted: Accept, now_ms: int, address: str = ""
    ) -> SlaveProgress:
        old = self._by_broker.get(broker_id)
        if old is not None:
            self._close(old, "replaced by a newer link of the same slave")
        link = SlaveProgress(
            link_id=self._next_link,
            broker_id=broker_id,
            start_offset=accepted.start_offset,
            sent_offset=accepted.start_offset,
            acked_offset=accepted.start_offset,
            connected_ms=now_ms,
            last_heard_ms=now_ms,
            last_sent_ms=now_ms,
            address=address,
        )
        self._next_link += 1
        self.links[link.link_id] = link
        self._by_broker[broker_id] = link.link_id
        self.acked_by_broker[broker_id] = accepted.start_offset
        if accepted.start_offset >= accepted.master_max_offset:
            link.caught_up_ms = now_ms
        return link

    def _close(self, link_id: int, reason: str) -> None:
        p = self.links.get(link_id)
        if p is not None and p.state is LinkState.STREAM:
            p.state = LinkState.CLOSED
            p.error = p.error or reason

    def disconnect(self, link_id: int) -> None:
        p = self.links.pop(link_id, None)
        if p is not None and self._by_broker.get(p.broker_id) == link_id:
            del self._by_broker[p.broker_id]

    def on_report(
        self,
        link_id: int,
        max_offset: int,
        now_ms: int,
        last_store_timestamp_ms: int = 0,
        master_max_offset: int | None = None,
    ) -> None:
        p = self.links[link_id]
        p.last_heard_ms = now_ms
        p.last_report_ms = now_ms
        p.last_store_timestamp_ms = max(p.last_store_timestamp_ms, last_store_timestamp_ms)
        if max_offset > p.sent_offset:
            p.error = f"report of {max_offset} beyond the {p.sent_offset} sent"
        elif max_offset < p.acked_offset:
            p.error = f"report of {max_offset} below the {p.acked_offset} already acknowledged"
        else:
            p.acked_offset = max_offset
            self.acked_by_broker[p.broker_id] = max_offset
            marks = p.catch_up_marks
            while marks and marks[0][0] <= max_offset:
                p.caught_up_ms = marks.popleft()[1]
            if master_max_offset is not None and max_offset >= master_max_offset:
                p.caught_up_ms = now_ms  # holds everything there is right now

    def on_protocol_error(self, link_id: int, reason: str) -> None:
        self.links[link_id].error = reason

    def on_sent(
        self, link_id: int, offset: int, length: int, now_ms: int, master_max_offset: int = 0
    ) -> None:
        p = self.links[link_id]
        assert offset == p.sent_offset, f"chunk at {offset}, expected {p.sent_offset}"
        p.sent_offset += length
        p.last_sent_ms = now_ms
        if p.sent_offset >= master_max_offset:
            p.catch_up_marks.append((p.sent_offset, now_ms))

    def on_heartbeat_sent(self, link_id: int, now_ms: int) -> None:
        self.links[link_id].last_sent_ms = now_ms

    def next_action(self, link_id: int, master_max_offset: int, now_ms: int) -> Action:
        """What the link's sender does next."""
        p = self.links[link_id]
        cfg = self.config
        if p.state is LinkState.CLOSED:
            return Drop(p.error or "closed")
        if p.error is not None:
            return Drop(p.error)
        if now_ms - p.last_heard_ms >= cfg.idle_timeout_ms:
            return Drop(f"slave silent for {now_ms - p.last_heard_ms} ms")
        room = cfg.max_in_flight_bytes - p.in_flight_bytes
        if p.sent_offset < master_max_offset and room > 0:
            file_end = p.sent_offset - p.sent_offset % self.file_size + self.file_size
            length = min(
                cfg.chunk_bytes, room, master_max_offset - p.sent_offset, file_end - p.sent_offset
            )
            return Send(p.sent_offset, length)
        if now_ms - p.last_sent_ms >= cfg.heartbeat_interval_ms:
            return SendHeartbeat()
        return Wait()

    def progress(self) -> list[SlaveProgress]:
        return sorted(self.links.values(), key=lambda p: p.broker_id)

    def is_in_sync(self, p: SlaveProgress, master_max_offset: int) -> bool:
        """A live link that may acknowledge SYNC sends: a member of the ISR under automatic
        failover, else no further behind than the bound."""
        if p.state is not LinkState.STREAM or p.error is not None:
            return False
        if self.isr is not None:
            return p.broker_id in self.isr
        return p.lag_bytes(master_max_offset) <= self.config.insync_max_lag_bytes

    def in_sync(self, master_max_offset: int) -> list[SlaveProgress]:
        return [p for p in self.progress() if self.is_in_sync(p, master_max_offset)]

    def _isr_slaves(self) -> list[int]:
        assert self.isr is not None
        return [m for m in self.isr if m != self.master_id]

    def quorum_available(self, master_max_offset: int) -> bool:
        """Enough slaves are in sync for a SYNC send to wait (else SLAVE_NOT_AVAILABLE)."""
        if self.isr is not None:
            return len(self._isr_slaves()) >= self.config.min_insync_replicas
        return len(self.in_sync(master_max_offset)) >= self.config.min_insync_replicas

    def confirmed_offset(self, master_max_offset: int) -> int | None:
        """What the SYNC acknowledgement counts as held. Classic: what at least
        ``min_insync_replicas`` in-sync slaves hold, None without a quorum. Automatic failover:
        what every ISR slave holds (the ISR is who may succeed this master), None with fewer
        than ``min_insync_replicas`` of them."""
        if self.isr is not None:
            if len(self._isr_slaves()) < self.config.min_insync_replicas:
                return None
            return confirmed_by_isr(
                self.master_id, self.isr, self.acked_by_broker, master_max_offset
            )
        acked = [p.acked_offset for p in self.in_sync(master_max_offset)]
        return quorum_offset(acked, self.config.min_insync_replicas)

    def replica_views(self) -> dict[int, ReplicaView]:
        """Every slave seen this mastership, for the ISR decision."""
        out = {b: ReplicaView(b, False, acked, None) for b, acked in self.acked_by_broker.items()}
        for p in self.progress():
            if p.state is LinkState.STREAM and p.error is None:
                out[p.broker_id] = ReplicaView(p.broker_id, True, p.acked_offset, p.caught_up_ms)
        return out

    def lags(self, master_max_offset: int, master_last_store_timestamp_ms: int) -> list[SlaveLag]:
        return [
            SlaveLag(
                broker_id=p.broker_id,
                address=p.address,
                acked_offset=p.acked_offset,
                lag_bytes=p.lag_bytes(master_max_offset),
                lag_seconds=p.lag_seconds(master_max_offset, master_last_store_timestamp_ms),
                in_sync=self.is_in_sync(p, master_max_offset),
                connected_ms=p.connected_ms,
            )
            for p in self.progress()
            if p.state is LinkState.STREAM
        ]
