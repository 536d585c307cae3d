"""An idempotent producer's identity: its producer id, its epoch and the next sequence of each
queue it sends to. The broker stores each (id, queue, sequence) once and answers a retry with
the first store's result, so a send retried after a timeout or a failover is stored once.

A sequence is given when a message is bound to its queue and stays with it through every retry
(so the message never moves to another queue). A message that fails for good leaves a hole in
its queue's sequence that later sends would wait behind: the epoch goes up, which starts every
queue again at 0 (the broker fences the older epoch).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemq.producer.blocks import Block
    from tidemq.producer.pending import Pending

    Sendable = Pending | Block

MAX_PRODUCER_ID = (1 << 63) - 1
MAX_EPOCH = (1 << 31) - 1
_EPOCH_BASE_S = 1_700_000_000  # a configured producer id's epoch: seconds since late 2023


def restart_epoch(now_s: float | None = None) -> int:
    """The epoch of a producer whose id is configured: a value that grows across restarts (the
    wall clock's seconds), so a restarted producer fences the one it replaces."""
    now = time.time() if now_s is None else now_s
    return max(0, min(MAX_EPOCH, int(now) - _EPOCH_BASE_S))


QueueKey = tuple[str, str, int]  # topic, broker group, queue id


class ProducerIdentity:
    def __init__(self, producer_id: int | None = None) -> None:
        if producer_id is None:
            self.producer_id = random.getrandbits(63) or 1
            self.epoch = 0
        else:
            self.producer_id = producer_id
            self.epoch = restart_epoch()
        self._next: dict[QueueKey, int] = {}
        # Sequences given and not answered yet, per (queue, epoch).
        self._unresolved: dict[tuple[QueueKey, int], set[int]] = {}
        self.epoch_bumps = 0
        # When a sequence of each (queue, epoch) was last answered (monotonic seconds).
        self._settled_at: dict[tuple[QueueKey, int], float] = {}

    def assign(self, p: Sendable) -> None:
        """Gives the message, just bound to its queue, the queue's next sequence (a block its
        next ``count``: one run, identified by its first)."""
        q = p.queue
        assert q is not None
        key = (q.topic, q.broker_name, q.queue_id)
        seq = self._next.get(key, 0)
        self._next[key] = seq + p.count
        p.sequence = seq
        p.producer_epoch = self.epoch
        self._unresolved.setdefault((key, self.epoch), set()).add(seq)

    def earlier_unresolved(self, p: Sendable) -> bool:
        """Whether an earlier sequence of the message's queue (and epoch) is still on its way:
        its SEQUENCE_GAP may heal once that one arrives."""
        q = p.queue
        assert q is not None
        waiting = self._unresolved.get(((q.topic, q.broker_name, q.queue_id), p.producer_epoch))
        return waiting is not None and min(waiting) < p.sequence

    def settled_since(self, p: Sendable, since_s: float) -> bool:
        """Whether a sequence of the message's queue (and epoch) was answered after
        ``since_s`` (monotonic)."""
        q = p.queue
        assert q is not None
        at = self._settled_at.get(((q.topic, q.broker_name, q.queue_id), p.producer_epoch))
        return at is not None and at >= since_s

    def settle_stored(self, group: Sequence[Sendable]) -> None:
        """A request's messages, all answered as stored (once per request, not per message)."""
        now = time.monotonic()
        unresolved, settled_at = self._unresolved, self._settled_at
        for p in group:
            q = p.queue
            assert q is not None
            k = ((q.topic, q.broker_name, q.queue_id), p.producer_epoch)
            settled_at[k] = now
            waiting = unresolved.get(k)
            if waiting is not None:
                waiting.discard(p.sequence)
                if not waiting:
                    del unresolved[k]

    def settle(self, p: Sendable, stored: bool) -> None:
        """The message is answered: stored, or failed for good (which raises the epoch)."""
        q = p.queue
        assert q is not None
        k = ((q.topic, q.broker_name, q.queue_id), p.producer_epoch)
        self._settled_at[k] = time.monotonic()
        waiting = self._unresolved.get(k)
        if waiting is not None:
            waiting.discard(p.sequence)
            if not waiting:
                del self._unresolved[k]
        if not stored and p.producer_epoch == self.epoch:
            self.bump_epoch()

    def bump_epoch(self) -> None:
        self.epoch += 1
        self._next.clear()
        self._settled_at.clear()
        self.epoch_bumps += 1
