"""Deciding a receive on one queue: which open entries go again and which new messages go.

``plan_receive`` reads a ``QueueInFlight``'s entries and indexes (handed in by
``QueueInFlight.plan_receive``) and changes nothing: redeliveries come first (for FIFO, only
a message group's lowest open offset may go; otherwise the ``DueIndex`` finds what came due),
then new messages from the cursor on, skipping what the tag filter drops and holding back
what waits behind an earlier message of its FIFO group.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidemq.services.broker.receive.decisions import NewMessages, ReceivePlan
from tidemq.services.broker.receive.due_index import HELD, DueIndex, Slot
from tidemq.services.broker.receive.group_heads import GroupHeads
from tidemq.services.broker.receive.retry_policy import RetryPolicy

# Candidates one plan may look at: a backlog of messages that all fail the tag filter is
# walked over a few receives, each recording a bounded Received event.
MAX_SCAN_PER_PLAN = 4096


def plan_receive(
    entries: Mapping[int, Slot],
    heads: GroupHeads,
    index: DueIndex,
    held_count: int,
    start_cursor: int,
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
    held_left = held_count
    if fifo:
        held_left = _retries_fifo(
            entries,
            heads,
            index,
            held_count,
            now_ms,
            max_messages,
            delivered,
            blocked,
            max_attempts,
            policy,
        )
    elif not held_left:
        # No order to keep: the index finds what came due without walking every lease.
        for offset, s in index.retries(entries, now_ms, max_messages, max_attempts, policy):
            delivered.append((offset, s.attempt + 1, s.group_hash, None))
    else:  # held back while the group was FIFO: walk every entry (rare)
        held_left = _retries_in_order(
            entries, held_count, now_ms, max_messages, delivered, max_attempts, policy
        )
    filtered: list[int] = []
    held: list[tuple[int, int]] = []
    cursor = start_cursor
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
            elif fifo and gh and (gh in blocked or heads.head(gh, entries) is not None):
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
    if not delivered and not filtered and not held and cursor == start_cursor:
        return None
    return ReceivePlan(delivered, tuple(filtered), tuple(held), cursor)


def _retries_fifo(
    entries: Mapping[int, Slot],
    heads: GroupHeads,
    index: DueIndex,
    held_count: int,
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

    def first_of_group(offset: int, s: Slot) -> bool:
        return not s.group_hash or heads.head(s.group_hash, entries) == offset

    due = index.retries(entries, now_ms, max_messages, max_attempts, policy, first_of_group)
    ready = sorted(due + heads.held_heads(entries, max_messages), key=lambda e: e[0])
    held_left = held_count
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
    entries: Mapping[int, Slot],
    held_count: int,
    now_ms: int,
    max_messages: int,
    delivered: list[tuple[int, int, int, object | None]],
    max_attempts: int,
    policy: RetryPolicy,
) -> int:
    """Not FIFO, but messages held while it was: walk the open entries lowest first;
    fills ``delivered``, returns how many held entries stay held."""
    held_left = held_count
    for offset, s in entries.items():
        if len(delivered) >= max_messages:
            break
        if s.kind == HELD:
            delivered.append((offset, 1, s.group_hash, None))
            held_left -= 1
        elif s.attempt < max_attempts and s.deliverable_at(policy) <= now_ms:
            delivered.append((offset, s.attempt + 1, s.group_hash, None))
    return held_left
