"""One receive group's in-flight state on one queue, as a pure state machine.

``QueueInFlight`` keeps ``floor`` (every offset below is done: acked, dead-lettered or
filtered out), ``cursor`` (every offset at or above was never looked at for the group) and an
entry per open offset between them: in flight (held under a lease until its deadline),
released (nacked: visible again at a set time), or held back (FIFO: never delivered, waiting
behind an earlier message of its message group). An offset in ``[floor, cursor)`` without an
entry is done, so done messages cost nothing and memory follows what is open.

Entries share their state: every entry one event put in the same condition (a batch of 32
delivered under one lease, say) points at one ``Slot``; an entry costs a dict slot, its
offset's int and 8 bytes in the slot's offset array (about 100 bytes a message in batches of
32, 270 received one at a time: ``states.measure_bytes_per_entry``). Expiry takes no event:
a lease whose deadline passed is released by the clock, deliverable again at
``max(deadline, lease start + policy.delay_ms(attempt))``.

Two derived indexes keep a receive from walking every open entry: ``DueIndex`` (when leases
end and released messages come due) and, for FIFO, ``GroupHeads`` (each message group's first
open offset). Both are rebuilt from the entries when needed and never part of the state.

Handle checks: an offset below the floor or done above it answers ACKED (a second ack of a
message gets "already acked", whatever finished it), one beyond the cursor or never leased
under the handle's lease UNKNOWN, an older lease SUPERSEDED, the current one OK until its
deadline and EXPIRED after.

The state changes only through ``apply(event, lease_id)``, deterministic and tolerant as a
log replay must be (an item whose lease no longer matches lost a race and is ignored), so a
slave applying the same records reaches the same state. ``plan_receive`` decides a receive
without changing anything: the caller appends ``plan.event(...)`` and applies it.
"""

from __future__ import annotations

from tidemq.services.broker.receive.decisions import (
    Candidate,
    HandleStatus,
    NewMessages,
    ReceivePlan,
)
from tidemq.services.broker.receive.due_index import (
    HELD,
    IN_FLIGHT,
    RELEASED,
    DueIndex,
    Slot,
    held_slot,
)
from tidemq.services.broker.receive.events import (
    Acked,
    Changed,
    Dead,
    Event,
    Init,
    Received,
    Reset,
)
from tidemq.services.broker.receive.group_heads import GroupHeads
from tidemq.services.broker.receive.retry_policy import RetryPolicy

__all__ = ["Candidate", "HandleStatus", "NewMessages", "QueueInFlight", "ReceivePlan"]

# Candidates one plan may look at: a backlog of messages that all fail the tag filter is
# walked over a few receives, each recording a bounded Received event.
MAX_SCAN_PER_PLAN = 4096


class QueueInFlight:
    """Receive progress of one group on one queue (see the module docstring)."""

    __slots__ = ("_entries", "_heads", "_held", "_index", "cursor", "floor")

    def __init__(self, start_offset: int) -> None:
        if start_offset < 0:
            raise ValueError(f"start offset must be >= 0, got {start_offset}")
        self.floor = start_offset
        self.cursor = start_offset
        # Keys ascend in insertion order (new offsets only ever arrive at the cursor), so
        # iterating the dict walks the open offsets lowest first.
        self._entries: dict[int, Slot] = {}
        self._held = 0
        self._index = DueIndex()
        self._heads = GroupHeads()

    # ---- applying events ----

    def apply(self, event: Event, lease_id: int) -> None:
        """Apply one event recorded at CommitLog offset ``lease_id``."""
        if isinstance(event, Received):
            self._apply_received(event, lease_id)
        elif isinstance(event, Acked | Dead):
            entries = self._entries
            for offset, lease in event.items:
                s = entries.get(offset)
                if s is not None and s.kind != HELD and s.lease_id == lease:
                    del entries[offset]
                    if s.leave():
                        self._index.emptied()
                    if s.group_hash:
                        self._heads.closed(s.group_hash, entries)
        elif isinstance(event, Changed):
            kind = RELEASED if event.released else IN_FLIGHT
            cache: dict[tuple[int, int, int], Slot] = {}
            entries = self._entries
            for offset, old_lease, until in event.items:
                s = entries.get(offset)
                if s is None or s.kind == HELD or s.lease_id != old_lease:
                    continue
                k = (s.attempt, s.group_hash, until)
                ns = cache.get(k)
                if ns is None:
                    ns = cache[k] = Slot(
                        kind, s.attempt, s.group_hash, lease_id, event.now_ms, until
                    )
                    self._index.add(ns)
                entries[offset] = ns
                ns.join(offset)
                if s.leave():
                    self._index.emptied()
        elif isinstance(event, Reset):
            self._entries.clear()
            self._index.clear()
            self._heads.clear()
            self._held = 0
            self.floor = self.cursor = event.offset
            return
        elif isinstance(event, Init):
            return  # the queue exists already: its first Init made it
        self._advance_floor()

    def _apply_received(self, ev: Received, lease_id: int) -> None:
        entries = self._entries
        old_cursor, new_cursor = self.cursor, max(self.cursor, ev.cursor)
        cache: dict[tuple[int, int], Slot] = {}
        fresh: list[tuple[int, Slot]] = []
        for offset, attempt, group_hash in ev.delivered:
            if offset < self.floor or offset >= new_cursor:
                continue
            k = (attempt, group_hash)
            s = cache.get(k)
            if s is None:
                s = cache[k] = Slot(
                    IN_FLIGHT, attempt, group_hash, lease_id, ev.now_ms, ev.invisible_until_ms
                )
                self._index.add(s)
            if offset >= old_cursor:
                fresh.append((offset, s))
            else:
                old = entries.get(offset)
                if old is None:
                    continue  # done meanwhile: nothing to redeliver
                if old.kind == HELD:
                    self._held -= 1
                elif old.leave():
                    self._index.emptied()
                entries[offset] = s
                s.join(offset)
        for offset, group_hash in ev.held:
            if old_cursor <= offset < new_cursor:
                fresh.append((offset, held_slot(group_hash)))
                self._held += 1
        if fresh:
            fresh.sort(key=lambda e: e[0])
            for offset, s in fresh:
                if offset in entries:  # listed twice in one event: keep the first
                    if s.kind == HELD:
                        self._held -= 1
                    continue
                entries[offset] = s
                if s.kind != HELD:
                    s.join(offset)
                if s.group_hash:
                    self._heads.opened(offset, s, entries)
        self.cursor = new_cursor
        self._advance_floor()

    def _advance_floor(self) -> None:
        entries = self._entries
        if not entries:
            self.floor = self.cursor
            return
        floor, cursor = self.floor, self.cursor
        while floor < cursor and floor not in entries:
            floor += 1
        self.floor = floor
        # Entries below the floor cannot exist: the floor only passes offsets without one.

    # ---- questions ----

    def check(self, offset: int, lease_id: int, now_ms: int) -> HandleStatus:
        """Is the handle (offset, lease_id) the current holder's at ``now_ms``?"""
        if offset < self.floor:
            return HandleStatus.ACKED
        if offset >= self.cursor:
            return HandleStatus.UNKNOWN
        s = self._entries.get(offset)
        if s is None:
            return HandleStatus.ACKED
        if s.kind == HELD or lease_id > s.lease_id:
            return HandleStatus.UNKNOWN
        if lease_id < s.lease_id:
            return HandleStatus.SUPERSEDED
        if s.kind != IN_FLIGHT:
            return HandleStatus.UNKNOWN  # a nack's record leases to nobody
        return HandleStatus.OK if now_ms < s.until_ms else HandleStatus.EXPIRED

    def attempt(self, offset: int) -> int:
        """Deliveries of the offset so far (0: not open, or held and never delivered)."""
        s = self._entries.get(offset)
        return 0 if s is None else s.attempt

    def group_hash(self, offset: int) -> int:
        s = self._entries.get(offset)
        return 0 if s is None else s.group_hash

    def lease_id(self, offset: int) -> int | None:
        """The lease (record) that last changed the open offset; None when held or not open."""
        s = self._entries.get(offset)
        return None if s is None or s.kind == HELD else s.lease_id

    def visible_at_ms(self, offset: int, policy: RetryPolicy | None = None) -> int | None:
        """When the open offset may be delivered again: a nack's time, else the lease deadline
        (with ``policy``: the later of it and the retry delay after the lease's start)."""
        s = self._entries.get(offset)
        if s is None or s.kind == HELD:
            return None
        return s.until_ms if policy is None else s.deliverable_at(policy)

    def is_open(self, offset: int) -> bool:
        return offset in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def plan_receive(
        self,
        now_ms: int,
        max_messages: int,
        new: NewMessages,
        *,
        fifo: bool,
        max_attempts: int,
        policy: RetryPolicy,
        max_held: int,
    ) -> ReceivePlan | None:
        """What a receive of up to ``max_messages`` at ``now_ms`` delivers; None: nothing to
        deliver and nothing to record. Changes nothing."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        delivered: list[tuple[int, int, int, object | None]] = []
        # FIFO: the message groups that have an open offset earlier than where the scan is; a
        # group's only deliverable offset is its lowest open one.
        blocked: set[int] = set()
        held_left = self._held
        if fifo:
            held_left = self._retries_fifo(
                now_ms, max_messages, delivered, blocked, max_attempts, policy
            )
        elif not held_left:
            # No order to keep: the index finds what came due without walking every lease.
            for offset, s in self._index.retries(
                self._entries, now_ms, max_messages, max_attempts, policy
            ):
                delivered.append((offset, s.attempt + 1, s.group_hash, None))
        else:  # held back while the group was FIFO: walk every entry (rare)
            held_left = self._retries_in_order(
                now_ms, max_messages, delivered, max_attempts, policy
            )
        filtered: list[int] = []
        held: list[tuple[int, int]] = []
        cursor = self.cursor
        scanned = 0
        window_full = False
        while len(delivered) < max_messages and scanned < MAX_SCAN_PER_PLAN and not window_full:
            batch = new.read(cursor, max_messages - len(delivered))
            before = cursor
            for c in batch:
                if c.offset < cursor:
                    continue  # the reader went back: ignore what is decided already
                if len(delivered) >= max_messages or scanned >= MAX_SCAN_PER_PLAN:
                    break
                gh = c.group_hash
                if not c.matches:
                    filtered.append(c.offset)
                elif (
                    fifo
                    and gh
                    and (gh in blocked or self._heads.head(gh, self._entries) is not None)
                ):
                    # The cursor stops before the first message the window has no room for:
                    # a stuck group holds back at most max_held messages, and every other
                    # group's messages up to there keep flowing.
                    if held_left + len(held) >= max_held:
                        window_full = True
                        break
                    held.append((c.offset, gh))
                else:
                    delivered.append((c.offset, 1, gh, c.message))
                    if fifo and gh:
                        blocked.add(gh)
                scanned += 1
                cursor = c.offset + 1
            if cursor == before:
                break
        if not delivered and not filtered and not held and cursor == self.cursor:
            return None
        return ReceivePlan(delivered, tuple(filtered), tuple(held), cursor)

    def _retries_fifo(
        self,
        now_ms: int,
        max_messages: int,
        delivered: list[tuple[int, int, int, object | None]],
        blocked: set[int],
        max_attempts: int,
        policy: RetryPolicy,
    ) -> int:
        """FIFO: the lowest offsets that are their message group's head (or have no group)
        and may go: released and due, or held and now first. Fills ``delivered`` and
        ``blocked``; returns how many held entries stay held."""
        entries, heads = self._entries, self._heads

        def first_of_group(offset: int, s: Slot) -> bool:
            return not s.group_hash or heads.head(s.group_hash, entries) == offset

        due = self._index.retries(
            entries, now_ms, max_messages, max_attempts, policy, first_of_group
        )
        ready = sorted(due + heads.held_heads(entries, max_messages), key=lambda e: e[0])
        held_left = self._held
        for offset, s in ready[:max_messages]:
            if s.kind == HELD:
                delivered.append((offset, 1, s.group_hash, None))
                held_left -= 1
            else:
                delivered.append((offset, s.attempt + 1, s.group_hash, None))
            if s.group_hash:
                blocked.add(s.group_hash)
        return held_left

    def _retries_in_order(
        self,
        now_ms: int,
        max_messages: int,
        delivered: list[tuple[int, int, int, object | None]],
        max_attempts: int,
        policy: RetryPolicy,
    ) -> int:
        """Not FIFO, but messages held while it was: walk the open entries lowest first;
        fills ``delivered``, returns how many held entries stay held."""
        held_left = self._held
        for offset, s in self._entries.items():
            if len(delivered) >= max_messages:
                break
            if s.kind == HELD:
                delivered.append((offset, 1, s.group_hash, None))
                held_left -= 1
            elif s.attempt < max_attempts and s.deliverable_at(policy) <= now_ms:
                delivered.append((offset, s.attempt + 1, s.group_hash, None))
        return held_left

    def dead_candidates(
        self, now_ms: int, max_attempts: int, policy: RetryPolicy
    ) -> list[tuple[int, int]]:
        """(offset, lease_id) of messages nobody holds that used up their deliveries, lowest
        offset first."""
        return self._index.exhausted(self._entries, now_ms, max_attempts, policy)

    def next_visible_ms(
        self, now_ms: int, policy: RetryPolicy, *, max_attempts: int | None = None
    ) -> int | None:
        """When to look again for messages to redeliver: the earliest time an entry that is
        not deliverable now may become so (leases ending count; at worst early, never late);
        None when there is none. ``max_attempts`` (default: as last asked) leaves out entries
        that will be dead-lettered rather than delivered."""
        limit = max_attempts if max_attempts is not None else self._index.max_attempts
        if self._index.behind(now_ms):  # rare: walk every entry
            times = [
                t
                for s in set(self._entries.values())
                if s.kind != HELD and s.attempt < limit and (t := s.deliverable_at(policy)) > now_ms
            ]
            return min(times, default=None)
        self._index.advance(self._entries, now_ms, limit, policy)
        return self._index.next_time(self._entries)

    def counts(self, now_ms: int, policy: RetryPolicy) -> tuple[int, int, int]:
        """(in flight, waiting to be retried, held back) at ``now_ms``."""
        inflight = retrying = 0
        for s in self._entries.values():
            if s.kind == IN_FLIGHT and now_ms < s.until_ms:
                inflight += 1
            elif s.kind != HELD:
                retrying += 1
        return inflight, retrying, self._held

    # ---- snapshot support (states.py) ----

    def items(self) -> list[tuple[int, Slot]]:
        """The open entries, lowest offset first."""
        return list(self._entries.items())

    @classmethod
    def restore(cls, floor: int, cursor: int, items: list[tuple[int, Slot]]) -> QueueInFlight:
        if not 0 <= floor <= cursor:
            raise ValueError(f"floor {floor} and cursor {cursor} out of order")
        q = cls(floor)
        q.cursor = cursor
        prev = floor - 1
        for offset, s in items:
            if not prev < offset < cursor:
                raise ValueError(f"entry offset {offset} out of order or range")
            prev = offset
            q._entries[offset] = s
            if s.kind != HELD:
                s.join(offset)
            if s.kind == HELD:
                q._held += 1
        q._heads.rebuild(q._entries)
        q._advance_floor()
        return q

    def state(self) -> tuple[int, int, list[tuple[int, tuple[int, ...]]]]:
        """Everything that defines the state, comparable: (floor, cursor, entries)."""
        return self.floor, self.cursor, [(o, s.fields()) for o, s in self._entries.items()]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueInFlight):
            return NotImplemented
        return self.state() == other.state()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"QueueInFlight(floor={self.floor}, cursor={self.cursor}, open={len(self)})"
