"""Cutting the CommitLog back, the one way both a running store (``MessageStore.truncate_to``: a
replica whose log diverged from its master's) and recovery (a torn tail, or corruption an
operator chose to cut) do it: the bytes removed are saved as evidence first, then ConsumeQueues,
index, the log's positions, its trusted end, the topic queue table and the dispatcher follow, so
nothing points past the new end.
"""

from __future__ import annotations

import json
import os

from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.clock import now_ms
from tidemq.storage.commitlog import CommitLog
from tidemq.storage.dispatch import Dispatcher
from tidemq.storage.index_service import IndexService
from tidemq.storage.queue_store import ConsumeQueueStore


class EvidenceWriter:
    """Saves bytes removed from the store, with a JSON note of why, under ``{root}/evidence/``."""

    def __init__(self, root_dir: str, kind: str, reason: str) -> None:
        self.directory = os.path.join(root_dir, "evidence")
        self.kind = kind
        self.reason = reason
        self.paths: list[str] = []
        self.total = 0

    def __call__(self, offset: int, data: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        stem = os.path.join(self.directory, f"{self.kind}-{offset:020d}-{now_ms()}")
        with open(stem + ".bin", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        note = {"kind": self.kind, "offset": offset, "length": len(data), "reason": self.reason}
        with open(stem + ".json", "w") as f:
            json.dump(note, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        self.paths.append(stem + ".bin")
        self.total += len(data)


def rewind_indexes(
    cl: CommitLog, queues: ConsumeQueueStore, index: IndexService | None, offset: int
) -> None:
    """ConsumeQueues and index forget every record at or past ``offset``; the topic queue table
    (the queue offset each queue's next message gets) follows the queues."""
    queues.rewind(offset)
    if index is not None:
        index.trim_to(offset)
    cl.reset_queue_table()  # refilled from the queues as they are used


def truncate_log(
    cl: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService | None,
    dispatcher: Dispatcher,
    offset: int,
    evidence: EvidenceWriter,
    *,
    exact: bool,
) -> None:
    """Cut the log at ``offset`` (a record boundary), handing the bytes removed to ``evidence``
    before they are destroyed; everything derived from the log follows.

    ``exact``: the files' write positions are true (a running store), so the evidence is exactly
    the bytes written; otherwise (recovery, after a crash) the data is taken to end at the last
    non-zero byte. The dispatcher and the trusted end never move forward here.
    """
    rewind_indexes(cl, queues, index, offset)
    cl.mfq.truncate(offset, evidence, exact=exact)
    cl.mfq.set_positions(offset)
    cl.trusted_end = min(cl.trusted_end, offset)
    dispatcher.offset = min(dispatcher.offset, offset)
    dispatcher.error = None
    dispatcher.stopped_at = None
    cl.last_write_raw = False
