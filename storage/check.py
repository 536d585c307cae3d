"""Offline verification of a store (``tidemq store check``) and a reader for people
(``tidemq store dump``). Read-only: nothing here repairs; the broker's recovery does that.

Checks, in order:
- every CommitLog record: magic, length, CRC, PHYSICALOFFSET equal to its position; after the last
  record only zeros (anything else is a torn tail recovery will cut);
- every record that should have a ConsumeQueue entry has exactly the right one;
- every ConsumeQueue entry points at a valid record of its topic, queue and queue offset;
- every index entry points at a valid record that carries a key with that hash.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from tidemq.storage.atomic_file import read_json_with_fallback
from tidemq.storage.consume_queue import ENTRY, ENTRY_SIZE, ConsumeQueue, is_blank
from tidemq.storage.errors import StoreError
from tidemq.storage.index_file import IndexFile
from tidemq.storage.javahash import index_key_hash
from tidemq.storage.lock import StoreLock
from tidemq.storage.manifest import LAYOUT_FILE
from tidemq.storage.mapped_file_queue import MappedFileQueue
from tidemq.storage.record import (
    END_OF_FILE,
    OK,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    RecordInfo,
    StoredMessage,
    check_record,
    decode_record,
)


@dataclass
class CheckReport:
    root: str
    clean_shutdown: bool
    commitlog_files: int = 0
    min_offset: int = 0
    max_offset: int = 0
    records: int = 0
    bytes: int = 0
    topics: dict[str, int] = field(default_factory=dict)
    consume_queues: int = 0
    consume_queue_entries: int = 0
    index_files: int = 0
    index_entries: int = 0
    problem_count: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def problem(self, text: str, limit: int = 20) -> None:
        self.problem_count += 1
        if len(self.problems) < limit:
            self.problems.append(text)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


class _OfflineStore:
    """The store's files mapped for reading, under the store lock so no broker writes meanwhile."""

    def __init__(self, root: str) -> None:
        layout = read_json_with_fallback(os.path.join(root, LAYOUT_FILE))
        if layout is None:
            raise StoreError(f"{root} is not a tidemq store (no {LAYOUT_FILE})")
        self.root = root
        self.layout = layout
        self.record_crc = bool(layout.get("record_crc", False))
        self.lock = StoreLock(root)
        self.lock.acquire()
        self.cl = MappedFileQueue(
            os.path.join(root, "commitlog"), layout["commitlog_file_size_bytes"]
        )
        self.queues: list[ConsumeQueue] = []
        self.index_files: list[IndexFile] = []
        try:
            self.cl.load()
            cq_root = os.path.join(root, "consumequeue")
            if os.path.isdir(cq_root):
                for topic in sorted(os.listdir(cq_root)):
                    tdir = os.path.join(cq_root, topic)
                    if not os.path.isdir(tdir):
                        continue
                    for qid in sorted(os.listdir(tdir), key=lambda s: (len(s), s)):
                        if qid.isdigit():
                            cq = ConsumeQueue(
                                root, topic, int(qid), layout["consume_queue_entries_per_file"]
                            )
                            cq.load()
                            self.queues.append(cq)
            idx = os.path.join(root, "index")
            if os.path.isdir(idx):
                for name in sorted(os.listdir(idx)):
                    if name.isdigit():
                        self.index_files.append(
                            IndexFile.open(
                                os.path.join(idx, name),
                                layout["index_slot_num"],
                                layout["index_max_num"],
                            )
                        )
        except BaseException:
            self.close()
            raise

    def record_at(self, phy: int) -> tuple[int, RecordInfo | str | None]:
        f = self.cl.find_file(phy)
        if f is None:
            return -1, "offset outside the CommitLog"
        return check_record(f.mm, phy - f.base_offset, f.size, True, phy, self.record_crc)

    def walk(self) -> Iterator[tuple[int, int, RecordInfo | str | None]]:
        """Every record with CRC checks; ends with the first non-record (status != OK/EOF)."""
        for f in self.cl.files:
            pos = 0
            while pos < f.size:
                status, info = check_record(
                    f.mm, pos, f.size, True, f.base_offset + pos, self.record_crc
                )
                yield f.base_offset + pos, status, info
                if status == OK:
                    assert isinstance(info, RecordInfo)
                    pos += info.size
                elif status == END_OF_FILE:
                    break
                else:
                    return

    def close(self) -> None:
        self.cl.close()
        for cq in self.queues:
            cq.close()
        for i in self.index_files:
            i.close()
        self.lock.release()


def _entries(cq: ConsumeQueue) -> Iterator[tuple[int, int, int, int]]:
    """(queue offset, phy, size, tag) of every written entry; stops at the first empty slot."""
    for f in cq.mfq.files:
        q0 = f.base_offset // ENTRY_SIZE
        for i, (phy, size, tag) in enumerate(ENTRY.iter_unpack(f.mm)):
            if phy < 0 or size <= 0:
                return
            yield q0 + i, phy, size, tag


def check_store(root: str) -> CheckReport:
    store = _OfflineStore(root)
    try:
        return _check(store)
    finally:
        store.close()


def _check(s: _OfflineStore) -> CheckReport:
    rep = CheckReport(root=s.root, clean_shutdown=not os.path.exists(os.path.join(s.root, "abort")))
    rep.commitlog_files = len(s.cl.files)
    rep.min_offset = s.cl.min_offset
    cqs = {(cq.topic, cq.queue_id): cq for cq in s.queues}
    cq_ends: dict[tuple[str, int], int] = {}
    for key, each in cqs.items():
        cq_ends[key] = sum(1 for _ in _entries(each)) + each.mfq.min_offset // ENTRY_SIZE
    end = s.cl.min_offset
    for at, status, info in s.walk():
        if status == OK:
            assert isinstance(info, RecordInfo)
            end = at + info.size
            rep.records += 1
            rep.bytes += info.size
            rep.topics[info.topic] = rep.topics.get(info.topic, 0) + 1
            if info.sys_flag & TRANSACTION_MASK in (TRANSACTION_PREPARED, TRANSACTION_ROLLBACK):
                continue
            cq = cqs.get((info.topic, info.queue_id))
            want = (at, info.size, info.entry_tag_code())
            if cq is None:
                rep.problem(
                    f"record at {at} ({info.topic}/{info.queue_id} offset "
                    f"{info.queue_offset}) has no ConsumeQueue"
                )
                continue
            if info.queue_offset * ENTRY_SIZE < cq.mfq.min_offset:
                continue
            got = (
                cq.get(info.queue_offset)
                if info.queue_offset < cq_ends[info.topic, info.queue_id]
                else None
            )
            if got != want:
                rep.problem(
                    f"record at {at} ({info.topic}/{info.queue_id} offset "
                    f"{info.queue_offset}): ConsumeQueue entry is {got}, expected {want}"
                )
        elif status == END_OF_FILE:
            end = at - at % s.cl.file_size + s.cl.file_size
        else:
            tail = s.cl.find_file(at)
            assert tail is not None
            rest = tail.mm[at - tail.base_offset :]
            later = [f for f in s.cl.files if f.base_offset > at]
            if rest.strip(b"\x00") or any(f.mm[:8].strip(b"\x00") for f in later):
                rep.problem(
                    f"CommitLog offset {at}: {info} (recovery cuts here, or refuses to "
                    f"start if valid records follow)"
                )
            break
    rep.max_offset = end
    for key, queue in cqs.items():
        rep.consume_queues += 1
        for q, phy, size, _tag in _entries(queue):
            rep.consume_queue_entries += 1
            if is_blank(phy, size) or phy < s.cl.min_offset:
                continue
            status, info = s.record_at(phy) if phy < end else (-1, "points past the end of the log")
            if status != OK or not isinstance(info, RecordInfo):
                rep.problem(f"ConsumeQueue {key[0]}/{key[1]} offset {q} -> {phy}: {info}")
            elif (info.topic, info.queue_id, info.queue_offset, info.size) != (*key, q, size):
                rep.problem(
                    f"ConsumeQueue {key[0]}/{key[1]} offset {q} -> {phy}: record is "
                    f"{info.topic}/{info.queue_id} offset {info.queue_offset}"
                )
    for idx in s.index_files:
        rep.index_files += 1
        for n, key_hash, phy, _ts in idx.iter_entries():
            rep.index_entries += 1
            if phy < s.cl.min_offset:
                continue
            status, info = s.record_at(phy) if phy < end else (-1, "points past the end of the log")
            if status != OK or not isinstance(info, RecordInfo):
                rep.problem(f"index {os.path.basename(idx.path)} entry {n} -> {phy}: {info}")
                continue
            keys = [k for k in (info.keys or b"").decode("utf-8", "replace").split(" ") if k]
            if info.uniq_key:
                keys.append(info.uniq_key.decode("utf-8", "replace"))
            if not any(index_key_hash(f"{info.topic}#{k}") == key_hash for k in keys):
                rep.problem(
                    f"index {os.path.basename(idx.path)} entry {n} -> {phy}: the record "
                    f"carries no key with hash {key_hash}"
                )
    return rep


def dump_records(root: str, topic: str | None = None) -> Iterator[StoredMessage]:
    """Decoded records in log order, optionally of one topic; stops at the end of valid data."""
    store = _OfflineStore(root)
    try:
        for at, status, info in store.walk():
            if status != OK or not isinstance(info, RecordInfo):
                if status == END_OF_FILE:
                    continue
                return
            if topic is None or info.topic == topic:
                f = store.cl.find_file(at)
                assert f is not None
                yield decode_record(f.mm, at - f.base_offset)
    finally:
        store.close()
