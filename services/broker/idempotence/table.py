"""The idempotence table: per producer id its epoch and, per (topic, queue), the next sequence
expected and where the most recent runs of sequences were stored. Pure: no I/O, no clock.

Rules for a send of producer ``pid`` at ``epoch`` (``decide``), message by message in request
order:

- epoch older than the one known -> ``ProducerFencedError`` (nothing stored);
- epoch newer -> the producer's sequences restart: every queue expects 0;
- seq == the next expected -> store it;
- seq < next -> a duplicate: answered from where the first store went (``Original``), or
  ``FORGOTTEN`` when that run is older than the last ``RUNS_PER_QUEUE`` runs;
- seq > next -> ``SequenceGapError`` (retriable: an earlier send is still on its way);
- a queue the table does not know for the producer (new, or evicted: the table keeps
  ``max_producers``, least recently used first out) starts at 0. Accepting any first
  sequence would let a producer's second request overtake its first on first contact and
  turn the first into a "duplicate" that was never stored. A forgotten producer's next send
  gets SEQUENCE_GAP with nothing before it on its way: the SDK fails it and starts a new epoch.

``record`` is the one way in for stored sequences, from the send path (right after the put)
and from the CommitLog scan alike; a sequence below the next one known changes nothing, so
both may see the same record.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

RUNS_PER_QUEUE = 32
"""Runs (requests, mostly) remembered per queue: far more than a producer keeps in flight."""


class ProducerFencedError(Exception):
    """A send from an epoch older than the producer id's newest."""


class SequenceGapError(Exception):
    """A sequence past the next expected: an earlier send of the queue is missing."""


class PartialRunError(Exception):
    """A block whose sequences are partly stored already."""


class Original(NamedTuple):
    """Where a duplicate's first store went (queue_offset -1: forgotten)."""

    topic: str
    queue_id: int
    queue_offset: int


FORGOTTEN = Original("", 0, -1)


class Run(NamedTuple):
    """Consecutive sequences stored at consecutive offsets of one queue."""

    first_seq: int
    length: int
    topic: str  # where they were stored (a delayed or half message's system queue)
    queue_id: int
    first_queue_offset: int


@dataclass(slots=True)
class QueueSeqs:
    next_seq: int
    runs: deque[Run] = field(default_factory=lambda: deque(maxlen=RUNS_PER_QUEUE))

    def original(self, seq: int) -> Original:
        for run in reversed(self.runs):
            if run.first_seq <= seq < run.first_seq + run.length:
                off = run.first_queue_offset + seq - run.first_seq
                return Original(run.topic, run.queue_id, off)
        return FORGOTTEN


@dataclass(slots=True)
class ProducerState:
    epoch: int
    queues: dict[tuple[str, int], QueueSeqs] = field(default_factory=dict)


QueueKey = tuple[str, int]


class IdempotenceTable:
    def __init__(self, max_producers: int) -> None:
        if max_producers <= 0:
            raise ValueError("max_producers must be > 0")
        self.max_producers = max_producers
        self.producers: OrderedDict[int, ProducerState] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.producers)

    def decide(
        self, pid: int, epoch: int, messages: Sequence[tuple[QueueKey, int]]
    ) -> list[Original | None]:
        """For each (queue, seq): None to store it, or its first store as a duplicate. Raises
        before deciding anything when the request may not store at all. Changes nothing."""
        state, restarted = self._sending(pid, epoch)
        nexts: dict[QueueKey, int] = {}
        out: list[Original | None] = []
        for key, seq in messages:
            expected = nexts.get(key)
            q = None
            if expected is None:
                if not restarted:
                    assert state is not None
                    q = state.queues.get(key)
                expected = q.next_seq if q is not None else 0
            if seq == expected:
                nexts[key] = seq + 1
                out.append(None)
            elif seq < expected:
                if q is None and not restarted:
                    assert state is not None
                    q = state.queues.get(key)
                out.append(q.original(seq) if q is not None else FORGOTTEN)
                nexts[key] = expected
            else:
                raise SequenceGapError(
                    f"producer {pid:#x} sent sequence {seq} of {key[0]}/{key[1]}, "
                    f"expected {expected}"
                )
        return out

    def decide_runs(
        self, pid: int, epoch: int, runs: Sequence[tuple[QueueKey, int, int]]
    ) -> list[Original | None]:
        """``decide`` for record blocks, each (queue, first sequence, count) stored whole or not
        at all: None to store the block, or the first store of its first sequence when the
        whole block is a duplicate (its others follow it: a block is stored as one run). A
        block that repeats stored sequences only in part cannot come from a producer that
        retries its blocks as they were (``PartialRunError``). Changes nothing."""
        state, restarted = self._sending(pid, epoch)
        nexts: dict[QueueKey, int] = {}
        out: list[Original | None] = []
        for key, seq, count in runs:
            q = state.queues.get(key) if state is not None and not restarted else None
            expected = nexts.get(key)
            if expected is None:
                expected = q.next_seq if q is not None else 0
            if seq == expected:
                nexts[key] = seq + count
                out.append(None)
            elif seq + count <= expected:
                out.append(q.original(seq) if q is not None else FORGOTTEN)
                nexts[key] = expected
            elif seq < expected:
                raise PartialRunError(
                    f"producer {pid:#x} sent sequences {seq}..{seq + count - 1} of "
                    f"{key[0]}/{key[1]} as one block, but those below {expected} are stored"
                )
            else:
                raise SequenceGapError(
                    f"producer {pid:#x} sent sequence {seq} of {key[0]}/{key[1]}, "
                    f"expected {expected}"
                )
        return out

    def _sending(self, pid: int, epoch: int) -> tuple[ProducerState | None, bool]:
        """The producer's state and whether this epoch restarts its sequences; raises when the
        epoch is fenced."""
        state = self.producers.get(pid)
        if state is not None and epoch < state.epoch:
            raise ProducerFencedError(
                f"producer {pid:#x} epoch {epoch} is fenced: epoch {state.epoch} took over"
            )
        return state, state is None or epoch > state.epoch

    def record(
        self,
        pid: int,
        epoch: int,
        key: QueueKey,
        first_seq: int,
        count: int,
        stored: QueueKey,
        first_queue_offset: int,
    ) -> None:
        """Sequences first_seq.. (count of them) stored at ``stored`` from first_queue_offset."""
        producers = self.producers
        state = producers.get(pid)
        if state is None:
            state = producers[pid] = ProducerState(epoch)
            if len(producers) > self.max_producers:
                producers.popitem(last=False)
                self.evicted += 1
        else:
            producers.move_to_end(pid)
            if epoch < state.epoch:
                return
            if epoch > state.epoch:
                state.epoch = epoch
                state.queues.clear()
        q = state.queues.get(key)
        if q is None:
            q = state.queues[key] = QueueSeqs(first_seq)
        elif first_seq + count <= q.next_seq:
            return  # known already (the master's own record, seen again by the scan)
        elif first_seq < q.next_seq:  # partly known: keep the new part
            skip = q.next_seq - first_seq
            first_seq, count = q.next_seq, count - skip
            first_queue_offset += skip
        runs = q.runs
        if runs:
            last = runs[-1]
            if (
                last.first_seq + last.length == first_seq
                and last.first_queue_offset + last.length == first_queue_offset
                and (last.topic, last.queue_id) == stored
            ):
                runs[-1] = last._replace(length=last.length + count)
                q.next_seq = first_seq + count
                return
        runs.append(Run(first_seq, count, stored[0], stored[1], first_queue_offset))
        q.next_seq = first_seq + count

    def next_seq(self, pid: int, key: QueueKey) -> int | None:
        state = self.producers.get(pid)
        q = state.queues.get(key) if state is not None else None
        return q.next_seq if q is not None else None

    def epoch_of(self, pid: int) -> int | None:
        state = self.producers.get(pid)
        return state.epoch if state is not None else None

    def clear(self) -> None:
        self.producers.clear()
