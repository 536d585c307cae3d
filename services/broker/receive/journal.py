"""The receive log: every change of receive state is one record of ``%SYS%RECEIVE_LOG`` (queue 0)
in the CommitLog, and the state is what applying those records in order gives (event sourcing).

The master appends (``append``) and applies the event at once with its lease id, the record's
CommitLog offset, in the same step of the event loop: nothing runs between the decision, the
append and the apply. Slaves receive the records as replicated bytes and apply them once
dispatched (``catch_up``, from a dispatch listener; ``event_log.FollowedLog``, which the timer
log shares); a broker promoted to master catches up before it decides anything
(``ReceiveService``). So every broker of a group holds the same state for the same log.

The log may be cut back under a broker: a slave's diverged tail truncated to its new master's
history, or a tail lost to a power cut before its flush. ``catch_up`` notices (the log ends
before the applied position, or the record the state ends with is gone or different) and
rebuilds: from the newest snapshot the log still agrees with, else by replaying the log from its
first retained record. Snapshots (``snapshot_files``) bound the replay at start-up; retention
keeps the log from the oldest kept snapshot on (``retention_position``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from tidemq.services.broker.event_log import FollowedLog, LogMark
from tidemq.services.broker.receive.events import (
    RECEIVE_LOG_TOPIC,
    Event,
    EventFormatError,
    decode_event,
    encode_event,
)
from tidemq.services.broker.receive.snapshot_files import (
    SnapshotFileError,
    SnapshotFiles,
    encode,
)
from tidemq.services.broker.receive.states import ReceiveStates
from tidemq.storage import Message, MessageStore, PutResult

log = logging.getLogger(__name__)

LOG_QUEUE = 0


class ReceiveJournal(FollowedLog[Event]):
    """Following the log, the master's check of its own records and the cut-back test are
    ``FollowedLog``'s; the receive states, their snapshots and the rebuild are here."""

    format_error = EventFormatError

    def __init__(self, store: MessageStore, store_dir: str) -> None:
        super().__init__(store, RECEIVE_LOG_TOPIC, LOG_QUEUE, "receive log")
        self.snapshots = SnapshotFiles(os.path.join(store_dir, "receive"))
        self.states = ReceiveStates()
        # Applied since the last snapshot was taken.
        self.changed = False
        # Called with every event applied (on the event loop): long polls wake on them.
        self.on_applied: Callable[[Event], None] | None = None

    # ------------------------------------------------------------------ start-up
    def _rebuild(self, why: str) -> None:
        """From the newest usable snapshot and the log after it, else from the log alone."""
        lo = self.store.min_offset(RECEIVE_LOG_TOPIC, LOG_QUEUE)
        for position in reversed(self.snapshots.positions()):
            try:
                mark, states = self.snapshots.read(position)
            except SnapshotFileError as e:
                log.warning("receive snapshot %d unusable (%s); trying an older one", position, e)
                continue
            if self._log_agrees(mark):
                self.states, self.mark = states, mark
                break
            log.warning("receive snapshot %d is not in the log any more (cut back)", position)
            self.snapshots.remove(position)
        else:
            if lo > 0:
                log.warning(
                    "receive log: no usable snapshot and the log starts at %d; in-flight state "
                    "of the records before it is lost (their messages count as not received)",
                    lo,
                )
            self.states, self.mark = ReceiveStates(), LogMark(lo)
        self.changed = True
        self._apply_all()
        log.info(
            "receive state rebuilt (%s): %d queues, log position %d",
            why,
            len(self.states),
            self.mark.next_offset,
        )

    # ------------------------------------------------------------------ the master
    def append(self, event: Event) -> tuple[int, PutResult]:
        """Put the event's record and apply it; returns (lease id, the put to wait on)."""
        body = encode_event(event)
        put = self.store.put_messages(
            [Message(topic=RECEIVE_LOG_TOPIC, queue_id=LOG_QUEUE, body=body)]
        )
        self.applied_put(put, event, body)
        return put.results[0].phy_offset, put

    # ------------------------------------------------------------------ applying
    def _decode(self, body: bytes) -> Event:
        return decode_event(body)

    def _apply(self, event: Event, lease_id: int) -> None:
        self.states.apply(event, lease_id)
        self.changed = True
        if self.on_applied is not None:
            self.on_applied(event)

    # ------------------------------------------------------------------ snapshots
    def snapshot_bytes(self) -> tuple[int, bytes] | None:
        """The state encoded now, on the event loop (None when nothing changed since the last);
        write it with ``write_snapshot`` off the loop."""
        if not self.changed:
            return None
        self.changed = False
        return self.mark.next_offset, encode(self.mark, self.states)

    def write_snapshot(self, position: int, data: bytes) -> None:
        self.snapshots.write(position, data)

    def retention_position(self) -> tuple[str, int, int]:
        """Where retention must keep the receive log from, as a consumer position: the record
        the oldest kept snapshot ends with (the whole log while there is none). Called from the
        store's housekeeping thread."""
        oldest = self.snapshots.oldest()
        return RECEIVE_LOG_TOPIC, LOG_QUEUE, max(0, oldest - 1) if oldest is not None else 0
