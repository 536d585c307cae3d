"""The store's two small bookkeeping files.

- ``store.json``: the layout (file sizes, index shape, record CRC) fixed when the store was
  created; reopening with another is refused rather than misreading every file.
- ``consumequeue/queues.json``: which ConsumeQueues exist with their offset range, and how far the
  index reaches, so recovery notices queue or index files that were lost.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tidemq.storage import state_file
from tidemq.storage.atomic_file import read_json_with_fallback, write_json_atomic
from tidemq.storage.config import StoreConfig
from tidemq.storage.consume_queue import ENTRY_SIZE, ConsumeQueue
from tidemq.storage.errors import ConfigError
from tidemq.storage.index_service import IndexService
from tidemq.storage.queue_store import ConsumeQueueStore

LAYOUT_FILE = "store.json"
MANIFEST_FILE = os.path.join("consumequeue", "queues.json")
FORMAT_VERSION = 1

log = logging.getLogger(__name__)


def check_layout(root: str, config: StoreConfig) -> None:
    """Record the layout of a new store; refuse one created with another."""
    path = os.path.join(root, LAYOUT_FILE)
    want = {
        "format_version": FORMAT_VERSION,
        "commitlog_file_size_bytes": config.commitlog_file_size_bytes,
        "consume_queue_entries_per_file": config.consume_queue_entries_per_file,
        "index_slot_num": config.index_slot_num,
        "index_max_num": config.index_max_num,
        "record_crc": config.record_crc,
    }
    fix = (
        f"copy {LAYOUT_FILE} from a store created with the same settings, or write the layout "
        f"this store was created with (the settings given now make {json.dumps(want)})"
    )
    have = state_file.load(path, dict[str, Any], fix)
    if have is None:
        if os.path.isdir(os.path.join(root, "commitlog")):
            raise ConfigError(f"{root} holds a CommitLog but no {LAYOUT_FILE}")
        write_json_atomic(path, want)
        return
    diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    if diff:
        raise ConfigError(
            f"store {root} was created with a different layout (stored, configured): {diff}"
        )


class Manifest:
    """``consumequeue/queues.json`` of one store, rewritten only when what it records changes."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._version = -1  # the queue store's version when last written
        self._index_files = -1
        # The ranges last read: what is written for a queue not mapped since the store opened
        # (its entries are not read just to record them; its files were checked against these).
        self._recorded: dict[tuple[str, int], tuple[int, int]] = {}

    def read(self) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
        """Queues with their (min, max) offsets, and the index's end offset, as last recorded."""
        path = os.path.join(self.root, MANIFEST_FILE)
        raw = read_json_with_fallback(path) or {}
        out: dict[tuple[str, int], tuple[int, int]] = {}
        try:
            for topic, qs in raw.get("queues", {}).items():
                for qid, (min_q, max_q) in qs.items():
                    out[topic, int(qid)] = (int(min_q), int(max_q))
            index_end = int(raw.get("index_end_phy_offset", -1))
        except (AttributeError, TypeError, ValueError) as e:
            # Derived bookkeeping, as when it is unparsable: treated as absent, rewritten later.
            log.warning("%s has the wrong shape (%s): treated as absent", path, e)
            out, index_end = {}, -1
        self._recorded = out
        return out, index_end

    def write(
        self, queues: ConsumeQueueStore, index: IndexService | None, *, force: bool = False
    ) -> None:
        """Record which queues exist with their offset range, and how far the index reaches, so
        recovery notices lost files. Rewritten when the set of queues or of index files changes,
        after retention and truncation, and at shutdown (``force``)."""
        # A version, not the set of keys: comparing sets each period cost O(queues) per period.
        version = queues.version
        index_files = len(index.files) if index is not None else 0
        if not force and version == self._version and index_files == self._index_files:
            return
        table: dict[str, dict[str, list[int]]] = {}
        recorded = self._recorded
        for key, cq in queues.items():
            table.setdefault(key[0], {})[str(key[1])] = list(self._range(cq, recorded.get(key)))
        os.makedirs(os.path.join(self.root, "consumequeue"), exist_ok=True)
        index_end = index.end_phy_offset if index is not None else -1
        write_json_atomic(
            os.path.join(self.root, MANIFEST_FILE),
            {"queues": table, "index_end_phy_offset": index_end},
        )
        self._version = version
        self._index_files = index_files

    @staticmethod
    def _range(cq: ConsumeQueue, recorded: tuple[int, int] | None) -> tuple[int, int]:
        """What to record for ``cq`` without mapping it: its true range when mapped or written
        here; else what was recorded before, or the start of its files (a floor never taken for
        a loss)."""
        if cq.mapped:
            return cq.min_offset, cq.max_offset
        first = cq.names_range[0] // ENTRY_SIZE
        if cq.known:
            return max(first, cq.min_logic_byte // ENTRY_SIZE), cq.max_offset
        return recorded if recorded is not None else (first, first)
