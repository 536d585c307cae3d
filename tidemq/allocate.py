"""Which consumer of a group reads which queues: RocketMQ's AllocateMessageQueueAveragely.

Every member computes the assignment itself from the same sorted inputs (queues from the route,
members from the broker), so no coordinator is needed and, once all members see the same
membership, each queue has exactly one owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """Contiguous ranges: with 8 queues and 3 members, sizes 3, 3, 2 in member order.

    ``queues`` and ``members`` must be sorted the same way by every member. A client that is
    not (yet) in ``members`` gets nothing, so it never steals a queue from a listed member.
    """
    if me not in members or not queues:
        return []
    n, m = len(queues), len(members)
    index = members.index(me)
    size = n // m + (1 if index < n % m else 0)
    start = index * (n // m) + min(index, n % m)
    return list(queues[start : start + size])
