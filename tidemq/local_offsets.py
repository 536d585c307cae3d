"""Where a broadcasting consumer keeps its offsets: a local file per group and instance, as
RocketMQ's LocalFileOffsetStore does (every member reads every queue, so the brokers keep none).

``<directory>/<group>/<instance>.json`` holds one JSON object from ``topic@broker#queue_id`` to
the next queue offset to read. It is replaced atomically (a temporary file, fsynced, renamed
over it, the directory fsynced), so a crash leaves the old offsets or the new ones, never a torn
mix. A file that cannot be read is reported and treated as absent: the consumer starts from its
``start_from`` position (at least once, never a skipped message it did not read).
"""

from __future__ import annotations

import json
import logging
import os

from tidemq.routes import MessageQueue

log = logging.getLogger(__name__)


def queue_key(mq: MessageQueue) -> str:
    return f"{mq.topic}@{mq.broker_name}#{mq.queue_id}"


class LocalOffsetStore:
    def __init__(self, directory: str, group: str, instance_name: str) -> None:
        self.path = os.path.join(directory, group, f"{instance_name}.json")

    def load(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as f:
                raw = json.loads(f.read())
            return {str(k): int(v) for k, v in raw.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, AttributeError, TypeError) as e:
            log.warning("ignoring unreadable consumer offsets %s: %s", self.path, e)
            return {}

    def save(self, offsets: dict[str, int]) -> None:
        """Replace the file with ``offsets`` (blocking: call it off the event loop)."""
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(offsets, indent=2, sort_keys=True).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
