"""The idempotence table saved beside the store, so a restart scans only the CommitLog after it
instead of the whole log (a cache: the log alone rebuilds the same table).

Saved only when the table holds exactly the records below its position (the scan caught up with
the log's end), with the last record it ends with: a log that no longer holds that record (cut
back, or lost in a power failure) is scanned from its start instead.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from tidemq.services.broker.idempotence.table import (
    RUNS_PER_QUEUE,
    IdempotenceTable,
    ProducerState,
    QueueSeqs,
    Run,
)

VERSION = 1


class SnapshotFormatError(ValueError):
    """A snapshot this version cannot read: the log is scanned from its start instead."""


def encode_snapshot(
    position: int, mark: tuple[int, int, int, str], table: IdempotenceTable
) -> bytes:
    producers = [
        [
            pid,
            state.epoch,
            [
                [key[0], key[1], q.next_seq, [list(r) for r in q.runs]]
                for key, q in state.queues.items()
            ],
        ]
        for pid, state in table.producers.items()  # least recently used first: kept in order
    ]
    doc = {"version": VERSION, "position": position, "mark": list(mark), "producers": producers}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_snapshot(data: bytes, table: IdempotenceTable) -> tuple[int, tuple[int, int, int, str]]:
    """Fills ``table`` (cleared first); returns the position and the mark it ends with."""
    try:
        doc: Any = json.loads(data)
        if doc.get("version") != VERSION:
            raise SnapshotFormatError(f"snapshot version {doc.get('version')!r}")
        phy, size, qoff, topic = doc["mark"]
        mark = (int(phy), int(size), int(qoff), str(topic))
        position = int(doc["position"])
        table.clear()
        for pid, epoch, queues in doc["producers"]:
            state = ProducerState(int(epoch))
            for topic_, qid, next_seq, runs in queues:
                q = QueueSeqs(int(next_seq), deque(maxlen=RUNS_PER_QUEUE))
                q.runs.extend(Run(int(a), int(b), str(c), int(d), int(e)) for a, b, c, d, e in runs)
                state.queues[(str(topic_), int(qid))] = q
            table.producers[int(pid)] = state
            if len(table.producers) > table.max_producers:
                table.producers.popitem(last=False)
    except SnapshotFormatError:
        table.clear()
        raise
    except (ValueError, KeyError, TypeError) as e:
        table.clear()
        raise SnapshotFormatError(f"unreadable snapshot: {e}") from None
    return position, mark
