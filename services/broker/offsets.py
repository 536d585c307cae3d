"""Committed consumer offsets, persisted as ``{store}/config/consumerOffset.json``.

Commits land in memory at once and reach disk atomically every ``flush_interval`` (5 s, the
broker's scheduler calls ``persist``) and at shutdown, as RocketMQ's ConsumerOffsetManager.
"""

from __future__ import annotations

import os
import threading

from storage.atomic_file import read_json_with_fallback, write_json_atomic


class OffsetManager:
    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "config", "consumerOffset.json")
        self._lock = threading.Lock()
        # "topic@group" -> queue id -> next offset to consume
        self.table: dict[str, dict[int, int]] = {}
        self._dirty = False
        raw = read_json_with_fallback(self.path)
        if raw:
            self.table = {
                key: {int(q): int(o) for q, o in queues.items()}
                for key, queues in raw.get("offsetTable", {}).items()
            }

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self.table.setdefault(self.key(topic, group), {})[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(self.key(topic, group), {}).get(queue_id)

    def persist(self) -> bool:
        """Write the table if it changed; returns whether it wrote."""
        with self._lock:
            if not self._dirty:
                return False
            snapshot = {k: {str(q): o for q, o in v.items()} for k, v in self.table.items()}
            self._dirty = False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_json_atomic(self.path, {"offsetTable": snapshot})
        return True
