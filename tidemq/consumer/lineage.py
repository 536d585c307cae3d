"""A pulled queue's lineage: the newest records a consumer pulled of one queue, kept so that
when it moves to another broker of the group (or back to one that failed a call) it can check
that the broker serves the records it read.

Without ``confirm_offset`` a master serves records no slave holds yet. When it fails, the new
master's queue goes on from where its own copy ends: the records the consumer read there are
gone and later sends take their queue offsets. A consumer that went on from its position would
skip those sends, acknowledged ones among them. So after a move the consumer first reads again
the newest record it pulled: the same record (message id, which names its CommitLog offset,
and its store and born times) means the broker's log is the one it read, since replicas are
byte-identical up to where they part; another record, or none, means they parted at or before
it, and the check steps back one pulled record at a time. The consumer goes on after the newest
record that matched (at least once: what it read beyond it may come again).

A broker can also change under a consumer without a move or a failed call: a master frozen past
its lease answers the pulls it held once it thaws, then returns as a slave and cuts its tail
back, and the route still names it until it is refreshed. So every pull's answer carries the
epoch of the answering log's newest entry (``log_epoch``), which a cut log changes before it
serves the records that replaced the cut ones; an answer at another epoch than the queue's
pulls read is dropped and checked the same way."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from tidemq.protos import broker_pb2

# Records remembered per queue: far more than a SYNC_MASTER can hold unreplicated (its sends
# in flight); an ASYNC_MASTER that lost more is read again from the oldest one remembered.
DEPTH = 256


class Mark(NamedTuple):  # a tuple, made only when a check compares one
    queue_offset: int
    msg_id: str
    store_timestamp_ms: int
    born_timestamp_ms: int


def mark_of(m: Any) -> Mark:
    """A pulled record's identity (a ``StoredMessage`` or a ``ReceivedMessage``)."""
    return Mark(m.queue_offset, m.msg_id, m.store_timestamp_ms, m.born_timestamp_ms)


class Lineage:
    """The newest records pulled of one queue, and whether the broker read next must show it
    holds them before the consumer goes on."""

    def __init__(self, depth: int = DEPTH) -> None:
        # The newest pulled messages themselves (their marks are made only when a check
        # compares them: making one per message pulled cost more than the rest of a pull).
        self._marks: deque[Any] = deque(maxlen=depth)
        self._source: str | None = None
        self._epoch: int | None = None  # the log epoch of the answers the marks came from
        self.checking = False
        # The oldest pulled record the last check found missing from the broker; None: none.
        self.parted_at: int | None = None

    def pulled(self, address: str, messages: Sequence[Any], log_epoch: int = 0) -> None:
        """A pull from ``address`` answered at ``log_epoch``; ``messages`` are what it brought."""
        self._source = address
        self._epoch = log_epoch
        self._marks.extend(messages[-DEPTH:])

    def answered_at(self, log_epoch: int) -> bool:
        """A pull's answer came from a log at ``log_epoch``. True (and a check begins) when the
        pulls so far read another epoch: the answer must not be taken until the check is done."""
        if self._marks and self._epoch is not None and log_epoch != self._epoch:
            self._start_check()
            return True
        return False

    def failed(self) -> None:
        """A pull failed: the broker may come back with a shorter log (an old master restarts
        as a slave and cuts what it alone held), so the next answer is checked."""
        if self._marks:
            self._start_check()

    def _start_check(self) -> None:
        if not self.checking:
            self.checking = True
            self.parted_at = None

    def reading_from(self, address: str) -> None:
        """The next pull goes to ``address``; another broker than the last one is checked."""
        if self._marks and self._source is not None and address != self._source:
            self._start_check()

    def check_offset(self) -> int:
        """The queue offset a check reads: the newest record not yet ruled out."""
        offset: int = self._marks[-1].queue_offset
        return offset

    def judge(
        self, position: int, status: int, messages: Sequence[Any], max_offset: int
    ) -> int | None:
        """The answer of a check (a pull from ``check_offset()``, ``max_offset`` the broker's
        end of the queue): the queue offset to go on from, or None to check one record back.
        ``position`` is where the consumer stands now."""
        newest = mark_of(self._marks[-1])
        if status == broker_pb2.OFFSET_TOO_SMALL:
            # Retention took the record: nothing left to compare; the pull that follows moves
            # the position as for any deleted range.
            self.checking = False
            return position
        if status == broker_pb2.FOUND and messages and mark_of(messages[0]) == newest:
            self.checking = False
            # Not ``position``: records a tag filter skipped after it may differ here too.
            return min(position, newest.queue_offset + 1)
        # Another record at its offset (or none): the logs parted at or before it.
        gone = self._marks.pop()
        if status in (broker_pb2.OFFSET_OVERFLOW, broker_pb2.NO_NEW_MESSAGE):
            # The broker's queue ends before it: nothing pulled from that end on was kept.
            while self._marks and self._marks[-1].queue_offset >= max_offset:
                gone = self._marks.pop()
        parted: int = gone.queue_offset
        self.parted_at = parted
        if self._marks:
            return None
        self.checking = False
        return min(parted, max_offset)
