"""FIFO message groups of one queue: each group's open offsets in order, and which held
messages have become their group's first.

In a FIFO queue only a message group's lowest open offset (its head) may be delivered, and a
new message of a group with any open offset is held back. ``GroupHeads`` answers both without
walking every open entry: per group a deque of the offsets opened for it (ascending, as new
offsets only arrive at the cursor; done ones leave lazily when they reach the front), and a
heap of held offsets that became heads when the message before them was acked or
dead-lettered. Derived state only, like the due index: rebuilt from the entries on restore.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping

from tidemq.services.broker.receive.due_index import HELD, Slot


class GroupHeads:
    __slots__ = ("_free_held", "_groups")

    def __init__(self) -> None:
        self._groups: dict[int, deque[int]] = {}
        self._free_held: list[int] = []  # held heads (may go stale: checked on use)

    def clear(self) -> None:
        self._groups.clear()
        self._free_held.clear()

    def rebuild(self, entries: Mapping[int, Slot]) -> None:
        self.clear()
        for offset, s in entries.items():
            if s.group_hash:
                self.opened(offset, s, entries)

    def opened(self, offset: int, slot: Slot, entries: Mapping[int, Slot]) -> None:
        """A new entry of a message group (offsets ascending)."""
        group = slot.group_hash
        dq = self._groups.get(group)
        if dq is None:
            dq = self._groups[group] = deque()
        dq.append(offset)
        if slot.kind == HELD and self.head(group, entries) == offset:
            heapq.heappush(self._free_held, offset)

    def closed(self, group: int, entries: Mapping[int, Slot]) -> None:
        """An entry of the group is done: a held message behind it may be the head now."""
        head = self.head(group, entries)
        if head is not None and entries[head].kind == HELD:
            heapq.heappush(self._free_held, head)

    def head(self, group: int, entries: Mapping[int, Slot]) -> int | None:
        """The group's lowest open offset; None when it has none."""
        dq = self._groups.get(group)
        if dq is None:
            return None
        while dq and dq[0] not in entries:
            dq.popleft()
        if not dq:
            del self._groups[group]
            return None
        return dq[0]

    def held_heads(self, entries: Mapping[int, Slot], max_count: int) -> list[tuple[int, Slot]]:
        """The lowest held offsets that are their group's head, at most ``max_count``
        (changes nothing the caller can see: a plan only reads)."""
        heap = self._free_held
        found: list[tuple[int, Slot]] = []
        while heap and len(found) < max_count:
            o = heapq.heappop(heap)
            s = entries.get(o)
            if s is None or s.kind != HELD or self.head(s.group_hash, entries) != o:
                continue  # delivered, done or reset meanwhile: stale
            if not found or found[-1][0] != o:
                found.append((o, s))
        for o, _ in found:
            heapq.heappush(heap, o)
        return found
