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
from collections.abc import Mapping

from tidemq.services.broker.receive.retry_policy import RetryPolicy

IN_FLIGHT, RELEASED, HELD = 1, 2, 3


class Slot:
    """The state shared by the entries one event put in the same condition.

    Immutable but for ``offsets``, the index's list of the entries given this slot (some may
    have moved on since: a user checks ``entries[offset] is slot``)."""

    __slots__ = ("attempt", "group_hash", "kind", "lease_id", "offsets", "start_ms", "until_ms")

    def __init__(
        self, kind: int, attempt: int, group_hash: int, lease_id: int, start_ms: int, until_ms: int
    ) -> None:
        self.kind = kind  # IN_FLIGHT, RELEASED or HELD
        self.attempt = attempt  # deliveries so far (0 while held)
        self.group_hash = group_hash
        self.lease_id = lease_id  # the record that made this state (0 while held)
        self.start_ms = start_ms  # that record's now_ms
        self.until_ms = until_ms  # IN_FLIGHT: deadline; RELEASED: visible-at
        self.offsets = array("q")

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

    def live(self, entries: Mapping[int, Slot]) -> array[int]:
        """The offsets still in this slot (compacts ``offsets``)."""
        if any(entries.get(o) is not self for o in self.offsets):
            self.offsets = array("q", [o for o in self.offsets if entries.get(o) is self])
        return self.offsets

    def __repr__(self) -> str:
        return f"Slot{self.fields()}"


class DueIndex:
    """When in-flight and released slots come due, for one queue (see the module docstring)."""

    __slots__ = (
        "_exhausted",
        "_high_ms",
        "_max_attempts",
        "_policy",
        "_ready",
        "_seq",
        "_timeline",
    )

    def __init__(self) -> None:
        self._timeline: list[tuple[int, int, Slot]] = []  # (time, tie-break, slot)
        self._ready: list[int] = []  # offsets whose slot was deliverable (may repeat, go stale)
        self._exhausted: dict[int, Slot] = {}  # id -> slot out of attempts, nobody holds it
        self._seq = 0
        self._policy: RetryPolicy | None = None
        self._max_attempts = -1
        self._high_ms = 0  # the latest now_ms it was advanced to

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
        self._seq += 1
        heapq.heappush(self._timeline, (at_ms, self._seq, slot))

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
                s.offsets = array("q")
                self.add(s)
            s.offsets.append(o)

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
        timeline = self._timeline
        while timeline and timeline[0][0] <= now_ms:
            _, _, s = heapq.heappop(timeline)
            live = s.live(entries)
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
    ) -> list[tuple[int, Slot]]:
        """The lowest offsets deliverable again at ``now_ms``, at most ``max_messages``."""
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
            if s.deliverable_at(policy) <= now_ms:
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
            live = s.live(entries)
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
        while timeline and not timeline[0][2].live(entries):
            heapq.heappop(timeline)
        return timeline[0][0] if timeline else None
