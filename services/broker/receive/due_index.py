"""The shared state of in-flight entries (``Slot``) and an index of when they come due.

A queue may have a million messages in flight; a receive must not walk all of them to find
the few whose lease ended. ``DueIndex`` keeps every in-flight or released slot on a timeline
(a heap by the time it may next be deliverable) and, once a slot's time has come, its offsets
on a heap of offsets ready to be delivered again, lowest first. Entries acked or re-leased
meanwhile are dropped lazily when the index meets them. The index is derived state only: it
is rebuilt from the entries on first use and whenever the policy or attempt limit it was
built for changes, it is not part of equality or snapshots, and its answers are what a walk
over all entries would give (the unit tests compare both on random histories).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Mapping, Sequence

from tidemq.services.broker.receive.retry_policy import RetryPolicy

IN_FLIGHT, RELEASED, HELD = 1, 2, 3


class Slot:
    """The state shared by the entries one event put in the same condition.

    Immutable but for the index's fields: ``offsets``, the entries given this slot (some may
    have moved on since: ``current`` checks ``entries[offset] is slot``), kept as None, one
    int (the entry's own key: no extra object for a slot of one message) or an array."""

    __slots__ = (
        "attempt",
        "due_ms",
        "group_hash",
        "kind",
        "lease_id",
        "live",
        "offsets",
        "start_ms",
        "until_ms",
    )

    def __init__(
        self, kind: int, attempt: int, group_hash: int, lease_id: int, start_ms: int, until_ms: int
    ) -> None:
        self.kind = kind  # IN_FLIGHT, RELEASED or HELD
        self.attempt = attempt  # deliveries so far (0 while held)
        self.group_hash = group_hash
        self.lease_id = lease_id  # the record that made this state (0 while held)
        self.start_ms = start_ms  # that record's now_ms
        self.until_ms = until_ms  # IN_FLIGHT: deadline; RELEASED: visible-at
        self.offsets: int | array[int] | None = None
        self.live = 0  # entries in this slot now
        self.due_ms = 0  # its place on the index's timeline (it is there at most once)

    def fields(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.kind,
            self.attempt,
            self.group_hash,
            self.lease_id,
            self.start_ms,
            self.until_ms,
        )

    def deliverable_at(self, policy: RetryPolicy) -> int:
        """When the entries may be delivered again: a nack's time; after a lease, the later of
        its deadline and the retry delay counted from the lease's start."""
        if self.kind == IN_FLIGHT:
            return max(self.until_ms, self.start_ms + policy.delay_ms(self.attempt))
        return self.until_ms

    def join(self, offset: int) -> None:
        held = self.offsets
        if held is None:
            self.offsets = offset
        elif isinstance(held, int):
            self.offsets = array("q", (held, offset))
        else:
            held.append(offset)
        self.live += 1

    def leave(self) -> bool:
        """An entry moved on (acked, re-leased, ...); True when it was the last one."""
        self.live -= 1
        if self.live > 0:
            return False
        self.offsets = None
        return True

    def current(self, entries: Mapping[int, Slot]) -> Sequence[int]:
        """The offsets still in this slot (compacts ``offsets``)."""
        held = self.offsets
        if held is None:
            return ()
        if isinstance(held, int):
            if entries.get(held) is self:
                return (held,)
            self.offsets = None
            return ()
        if any(entries.get(o) is not self for o in held):
            held = array("q", [o for o in held if entries.get(o) is self])
            self.offsets = held
        return held

    def __lt__(self, other: Slot) -> bool:  # the timeline heap's order
        return self.due_ms < other.due_ms

    def __repr__(self) -> str:
        return f"Slot{self.fields()}"


_HELD_SLOTS: dict[int, Slot] = {}


def held_slot(group_hash: int) -> Slot:
    # Held entries of one message group are alike forever: one slot per group, process-wide.
    s = _HELD_SLOTS.get(group_hash)
    if s is None:
        if len(_HELD_SLOTS) > 100_000:
            _HELD_SLOTS.clear()
        s = _HELD_SLOTS[group_hash] = Slot(HELD, 0, group_hash, 0, 0, 0)
    return s


class DueIndex:
    """When in-flight and released slots come due, for one queue (see the module docstring)."""

    __slots__ = (
        "_emptied",
        "_exhausted",
        "_high_ms",
        "_max_attempts",
        "_policy",
        "_ready",
        "_timeline",
    )

    def __init__(self) -> None:
        self._timeline: list[Slot] = []  # a heap by due_ms
        self._ready: list[int] = []  # offsets whose slot was deliverable (may repeat, go stale)
        self._exhausted: dict[int, Slot] = {}  # id -> slot out of attempts, nobody holds it
        self._policy: RetryPolicy | None = None
        self._max_attempts = -1
        self._high_ms = 0  # the latest now_ms it was advanced to
        self._emptied = 0

    @property
    def max_attempts(self) -> int:
        """The attempt limit the index was last advanced with (a big one before any)."""
        return self._max_attempts if self._max_attempts >= 0 else 1 << 31

    def add(self, slot: Slot) -> None:
        # A released slot is examined at once: it may be out of attempts (dead-letter it now)
        # before its visible-at time.
        if slot.kind != HELD:
            self._push(slot.until_ms if slot.kind == IN_FLIGHT else 0, slot)

    def _push(self, at_ms: int, slot: Slot) -> None:
        slot.due_ms = at_ms
        heapq.heappush(self._timeline, slot)

    def emptied(self) -> None:
        """A slot lost its last entry. Slots all acked long before their deadline (a 12 h
        lease, say) would otherwise stay on the timeline until it: drop them once they are
        half of it (amortized constant time per slot)."""
        self._emptied += 1  # counted here, dropped by advance: mid-event a slot may be empty

    def _drop_emptied(self) -> None:
        if self._emptied > 64 and self._emptied * 2 > len(self._timeline):
            self._timeline = [s for s in self._timeline if s.live > 0]
            heapq.heapify(self._timeline)
            self._emptied = 0

    def clear(self) -> None:
        self._timeline.clear()
        self._ready.clear()
        self._exhausted.clear()
        self._policy = None

    def _rebuild(self, entries: Mapping[int, Slot]) -> None:
        self._timeline.clear()
        self._ready.clear()
        self._exhausted.clear()
        seen: set[int] = set()
        for o, s in entries.items():
            if s.kind == HELD:
                continue
            if id(s) not in seen:
                seen.add(id(s))
                s.offsets = None
                s.live = 0
                self.add(s)
            s.join(o)

    def advance(
        self, entries: Mapping[int, Slot], now_ms: int, max_attempts: int, policy: RetryPolicy
    ) -> None:
        """Move the slots whose time has come to ``ready`` (or ``exhausted``)."""
        if (
            policy is not self._policy and policy != self._policy
        ) or max_attempts != self._max_attempts:
            self._rebuild(entries)
        self._policy, self._max_attempts = policy, max_attempts
        self._high_ms = max(self._high_ms, now_ms)
        self._drop_emptied()
        timeline = self._timeline
        while timeline and timeline[0].due_ms <= now_ms:
            s = heapq.heappop(timeline)
            live = s.current(entries)
            if not live:
                continue
            if s.attempt >= max_attempts:
                self._exhausted[id(s)] = s
                continue
            at = s.deliverable_at(policy)
            if at > now_ms:
                self._push(at, s)  # the retry delay outlasts the lease
                continue
            for o in live:
                heapq.heappush(self._ready, o)

    def retries(
        self,
        entries: Mapping[int, Slot],
        now_ms: int,
        max_messages: int,
        max_attempts: int,
        policy: RetryPolicy,
        accept: Callable[[int, Slot], bool] | None = None,
    ) -> list[tuple[int, Slot]]:
        """The lowest offsets deliverable again at ``now_ms`` (and taken by ``accept``, when
        given: FIFO takes only its groups' heads), at most ``max_messages``."""
        self.advance(entries, now_ms, max_attempts, policy)
        ready = self._ready
        found: list[tuple[int, Slot]] = []
        keep: list[int] = []
        taken: set[int] = set()
        while ready and len(found) < max_messages:
            o = heapq.heappop(ready)
            s = entries.get(o)
            if s is None or o in taken or s.kind == HELD:
                continue  # done, a repeat, or (never here) held
            if s.kind == IN_FLIGHT and now_ms < s.until_ms:
                if now_ms < self._high_ms:
                    keep.append(o)  # the clock went back: maybe the same lease, not yet over
                continue  # else leased again: its new slot is on the timeline
            if s.attempt >= max_attempts:
                self._exhausted[id(s)] = s
                continue
            keep.append(o)
            taken.add(o)
            if s.deliverable_at(policy) <= now_ms and (accept is None or accept(o, s)):
                found.append((o, s))
            # else the clock went back since the slot came due: it stays ready, not delivered
        for o in keep:
            heapq.heappush(ready, o)  # a plan changes nothing: applying it re-leases them
        return found

    def exhausted(
        self, entries: Mapping[int, Slot], now_ms: int, max_attempts: int, policy: RetryPolicy
    ) -> list[tuple[int, int]]:
        """(offset, lease_id) of entries nobody holds that used up their deliveries."""
        self.advance(entries, now_ms, max_attempts, policy)
        out: list[tuple[int, int]] = []
        for key, s in list(self._exhausted.items()):
            live = s.current(entries)
            if not live:
                del self._exhausted[key]
            elif s.kind == RELEASED or now_ms >= s.until_ms:  # the clock may have gone back
                out.extend((o, s.lease_id) for o in live)
        out.sort()
        return out

    def behind(self, now_ms: int) -> bool:
        """Was the index advanced past ``now_ms`` (the wall clock stepped back)? Then ready
        entries may not be deliverable yet at ``now_ms``, and ``next_time`` misses them."""
        return now_ms < self._high_ms

    def next_time(self, entries: Mapping[int, Slot]) -> int | None:
        """After ``advance``: a lower bound of the earliest time a slot comes due (a lease's
        deadline, where the retry delay may end later: a timer set by it wakes at worst early
        and asks again)."""
        timeline = self._timeline
        while timeline and not timeline[0].current(entries):
            heapq.heappop(timeline)
        return timeline[0].due_ms if timeline else None
