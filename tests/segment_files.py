"""Real CommitLog segments for the pipeline job tests, written by the real store.

``write_segments`` appends messages through ``MessageStore`` with small files (so there are
several segments, each ending in a blank marker, the last one partly zeros), closes the store and
returns its CommitLog directory plus what was appended, record by record.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemq.storage import Message, MessageStore, PutStatus, StoreConfig

FILE_SIZE = 16 * 1024
TOPICS = (("orders", 3), ("audit-log", 2))


@dataclass(frozen=True)
class Appended:
    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    tags: str
    keys: tuple[str, ...]
    body: bytes


def write_segments(root: Path, messages: int = 300) -> tuple[Path, list[Appended]]:
    cfg = StoreConfig(
        str(root),
        commitlog_file_size_bytes=FILE_SIZE,
        consume_queue_entries_per_file=64,
        index_slot_num=64,
        index_max_num=256,
    )
    planned = []
    for i in range(messages):
        topic, queues = TOPICS[i % len(TOPICS)]
        planned.append(
            Message(
                topic,
                f"body-{i}-".encode() * (1 + i % 7),
                queue_id=i % queues,
                tags=f"t{i % 3}",
                keys=[f"key-{i}"],
            )
        )
    appended = []
    with MessageStore(cfg, disk_usage_ratio=lambda: 0.0) as store:
        for msg in planned:
            put = store.put_messages([msg])
            assert put.wait(30) is PutStatus.PUT_OK
            [a] = put.results
            appended.append(
                Appended(
                    msg.topic,
                    msg.queue_id,
                    a.queue_offset,
                    a.phy_offset,
                    a.size,
                    msg.tags or "",
                    tuple(msg.keys),
                    msg.body,
                )
            )
    return root / "commitlog", appended


def copy_segments(src: Path, dst: Path) -> Path:
    """An archive copy, as an operator would take it."""
    shutil.copytree(src, dst)
    return dst


def segment_path(directory: Path, phy_offset: int) -> tuple[Path, int]:
    """The segment file of ``directory`` holding ``phy_offset``, and the position in it."""
    base = phy_offset - phy_offset % FILE_SIZE
    return directory / f"{base:020d}", phy_offset - base


@dataclass(frozen=True)
class Damaged:
    archive: Path  # a copy of the store's segments, one byte of ``victim`` flipped
    appended: list[Appended]
    victim: Appended
    file: Path
    file_offset: int  # of the victim in ``file``


def damaged_archive(tmp: Path, victim: int, byte_at: Callable[[Appended], int]) -> Damaged:
    """Segments written by the store, copied, and message ``victim``'s byte
    ``byte_at(victim)`` (counted from the record's start) flipped in the copy."""
    commitlog, appended = write_segments(tmp / "store")
    archive = copy_segments(commitlog, tmp / "archive")
    hit = appended[victim]
    path, at = segment_path(archive, hit.phy_offset)
    flip_byte(path, at + byte_at(hit))
    return Damaged(archive, appended, hit, path, at)


def flip_byte(path: Path, at: int) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
