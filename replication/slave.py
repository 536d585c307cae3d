"""The slave side of replication as a pure state machine: what to ask for, whether a chunk fits,
when to truncate, when to report and when the link is dead. No sockets, no clock, no store: the
transport appends and truncates, and passes ``now_ms``.

What a report acknowledges: everything appended, or under sync slave flush only what the transport
has flushed. Flushes are grouped: one per burst of chunks (none while more wait in the inbox,
unless the unflushed bytes reach a cap), so a busy link does not pay an fsync per chunk.

The one rule of a chunk: it starts exactly where the slave's log ends. Anything else (a gap, an
overlap, a chunk before the handshake was answered) ends the link; the next handshake then
re-establishes where the two logs agree, instead of appending bytes at the wrong place.
"""

from __future__ import annotations

from dataclasses import dataclass


class ProtocolError(Exception):
    """The master broke the stream's rules; the link is dropped and re-established."""


@dataclass(frozen=True, slots=True)
class TruncateTo:
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class ResyncFrom:
    """The master starts the stream past the local log's end (retention deleted everything in
    between): set the store aside and start again empty at ``offset``."""

    offset: int
    reason: str


@dataclass
class SlaveSession:
    """One link's state, from the handshake to its end."""

    file_size: int
    report_interval_ms: int
    idle_timeout_ms: int
    now_ms: int
    # Where the next chunk must start; None until the handshake is answered.
    expected_offset: int | None = None
    master_max_offset: int = 0
    last_heard_ms: int = 0
    last_report_ms: int = -1
    reported_offset: int = -1
    # Sync slave flush: reports acknowledge only what is flushed, and a burst of chunks is
    # flushed once it ends or reaches ``max_unflushed_bytes``.
    flush_sync: bool = False
    max_unflushed_bytes: int = 4 * 1024 * 1024
    flushed_offset: int = 0

    def __post_init__(self) -> None:
        # The first report goes out as soon as the handshake is answered (the offset differs);
        # until then only the idle timeout counts.
        self.last_heard_ms = self.now_ms
        self.last_report_ms = self.now_ms

    def on_accepted(
        self,
        start_offset: int,
        truncate: bool,
        reason: str,
        master_max_offset: int,
        local_empty: bool,
        local_max_offset: int,
        now_ms: int,
    ) -> TruncateTo | ResyncFrom | None:
        """Check the master's answer against the local log; returns the cut (or the resync) to
        make first."""
        if self.expected_offset is not None:
            raise ProtocolError("a second handshake answer on the same link")
        self.last_heard_ms = now_ms
        self.master_max_offset = master_max_offset
        if not 0 <= start_offset <= master_max_offset:
            raise ProtocolError(
                f"start {start_offset} outside the master's log [0, {master_max_offset}]"
            )
        action: TruncateTo | ResyncFrom | None = None
        if truncate:
            if local_empty or start_offset > local_max_offset:
                raise ProtocolError(
                    f"told to cut back to {start_offset}, but the local log ends at "
                    f"{local_max_offset}"
                )
            action = TruncateTo(start_offset, reason)
        elif local_empty or start_offset > local_max_offset:
            # Past a non-empty log's end: the master's retention deleted what lies between.
            if start_offset % self.file_size:
                raise ProtocolError(f"an empty log cannot start at {start_offset}, inside a file")
            if not local_empty:
                action = ResyncFrom(start_offset, reason)
        elif start_offset != local_max_offset:
            raise ProtocolError(
                f"told to continue at {start_offset}, but the local log ends at {local_max_offset}"
            )
        self.expected_offset = start_offset
        return action

    def on_chunk(self, offset: int, length: int, now_ms: int) -> None:
        """Validate a chunk before it is appended."""
        if self.expected_offset is None:
            raise ProtocolError("a chunk before the handshake was answered")
        if offset != self.expected_offset:
            raise ProtocolError(f"chunk at {offset}, but the log ends at {self.expected_offset}")
        if length <= 0:
            raise ProtocolError(f"empty chunk at {offset}")
        if offset // self.file_size != (offset + length - 1) // self.file_size:
            raise ProtocolError(f"chunk [{offset}, {offset + length}) spans two CommitLog files")
        self.last_heard_ms = now_ms

    def on_appended(self, end_offset: int) -> None:
        self.expected_offset = end_offset
        self.master_max_offset = max(self.master_max_offset, end_offset)

    def on_heartbeat(self, master_max_offset: int, now_ms: int) -> None:
        self.last_heard_ms = now_ms
        self.master_max_offset = master_max_offset

    def ack_offset(self) -> int:
        """The offset a report may acknowledge: the end of the log, or under sync slave flush
        the part of it known flushed."""
        end = self.expected_offset or 0
        return min(end, self.flushed_offset) if self.flush_sync else end

    def flush_due(self, more_waiting: bool) -> bool:
        """Sync slave flush: whether to flush before the next report. Not while more chunks
        wait to be appended (they join this flush), unless the unflushed bytes reached the cap."""
        if not self.flush_sync or self.expected_offset is None:
            return False
        unflushed = self.expected_offset - self.flushed_offset
        return unflushed > 0 and (not more_waiting or unflushed >= self.max_unflushed_bytes)

    def on_flushed(self, flushed_offset: int) -> None:
        """The log is durable up to ``flushed_offset`` (after a flush, or as the link starts)."""
        self.flushed_offset = flushed_offset

    def report_due(self, local_max_offset: int, now_ms: int) -> bool:
        """After every appended chunk, and at least every report interval."""
        return (
            local_max_offset != self.reported_offset
            or now_ms - self.last_report_ms >= self.report_interval_ms
        )

    def on_reported(self, local_max_offset: int, now_ms: int) -> None:
        self.reported_offset = local_max_offset
        self.last_report_ms = now_ms

    def silent(self, now_ms: int) -> bool:
        return now_ms - self.last_heard_ms >= self.idle_timeout_ms

    def next_deadline_ms(self) -> int:
        """When the transport must look again even if nothing arrives: the next report or the
        idle timeout, whichever is first."""
        return min(
            self.last_report_ms + self.report_interval_ms, self.last_heard_ms + self.idle_timeout_ms
        )

    def lag_bytes(self) -> int:
        return max(0, self.master_max_offset - (self.expected_offset or 0))

    def catch_up_warming(self, catch_up_warm_bytes: int) -> int:
        """How far ahead the store should warm now: ``catch_up_warm_bytes`` while this slave
        is further than that behind its master (catching up), else 0."""
        if catch_up_warm_bytes and self.lag_bytes() > catch_up_warm_bytes:
            return catch_up_warm_bytes
        return 0


class ReconnectBackoff:
    """How long the slave waits before its next attempt to link: exponential in the attempts
    made since the master last changed, from ``min_s`` up to ``max_s``.

    A new master starts again from the shortest wait. The registry often names the new master
    a moment before it serves replication (it refuses "not the master now" until its election
    completes); a wait grown on the old, dead master's refusals would keep the new master's
    slave away for up to ``max_s``, and a SYNC_MASTER without its slave answers sends and acks
    short of their durability (SLAVE_NOT_AVAILABLE) meanwhile. Attempts are numbered from 1,
    as tenacity numbers them (``wait(attempt)`` is the wait after attempt ``attempt`` failed).
    """

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._before_master = 0  # attempts made before the current master was named
        self._master_changed = False

    def master_changed(self) -> None:
        self._master_changed = True

    def wait(self, attempt: int) -> float:
        if self._master_changed or attempt <= self._before_master:
            # Named since the last wait: this attempt was the first that could reach it. (An
            # attempt number below the mark: a new series of attempts.)
            self._master_changed = False
            self._before_master = attempt - 1
        n = attempt - self._before_master
        return float(min(self.max_s, self.min_s * 2 ** (n - 1)))
