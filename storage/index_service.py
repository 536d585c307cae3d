"""The index directory (RocketMQ's IndexService): a sequence of IndexFiles named by creation
time, where dispatch puts each message's keys and queries look them up, newest file first.
Rolling to a new file when one is full, replays after a kill, trimming and retention are here;
the bytes of one file are ``index_file``'s.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from tidemq.storage import clock
from tidemq.storage.errors import StoreClosedError
from tidemq.storage.index_file import IndexFile, index_file_size
from tidemq.storage.javahash import topic_key_hash

_NAME = re.compile(r"\d{17}")
_NAME_TIME = "%Y%m%d%H%M%S"


def _file_name(ms: int) -> str:
    t = datetime.fromtimestamp(ms // 1000, UTC)
    return f"{t.strftime(_NAME_TIME)}{ms % 1000:03d}"


def _name_ms(name: str) -> int:
    t = datetime.strptime(name[:14], _NAME_TIME).replace(tzinfo=UTC)
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) + int(name[14:])


class IndexService:
    """The index directory: files named by creation time (UTC ``yyyyMMddHHmmssSSS``), oldest first.

    Thread-safe; ``load`` must run before anything else. Where RocketMQ is looser: a replay of the
    last indexed message completes it when a kill cut it between two keys, and files without
    entries (a kill right after a roll) take no part in queries or the replay check.
    """

    def __init__(
        self,
        directory: str,
        slot_num: int,
        max_index_num: int,
        now_ms: Callable[[], int] = clock.now_ms,
    ) -> None:
        index_file_size(slot_num, max_index_num)
        self.directory = directory
        self._slot_num = slot_num
        self._max = max_index_num
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._files: list[IndexFile] | None = None

    @property
    def slot_num(self) -> int:
        return self._slot_num

    @property
    def max_index_num(self) -> int:
        return self._max

    def _open_files(self) -> list[IndexFile]:
        if self._files is None:
            raise StoreClosedError(f"index service at {self.directory} is not loaded")
        return self._files

    def load(self) -> None:
        with self._lock:
            os.makedirs(self.directory, exist_ok=True)
            files: list[IndexFile] = []
            try:
                for name in sorted(os.listdir(self.directory)):
                    path = os.path.join(self.directory, name)
                    if name.endswith(".tmp") and _NAME.fullmatch(name[:-4]):
                        os.unlink(path)  # a create that died before its rename
                    elif _NAME.fullmatch(name):
                        files.append(IndexFile.open(path, self._slot_num, self._max))
                if files:
                    files[-1].repair_torn()
            except BaseException:
                for f in files:
                    f.close()
                raise
            self._files = files

    def _create(self, begin_phy_offset: int, begin_timestamp: int) -> IndexFile:
        files = self._open_files()
        ms = self._now_ms()
        if files:
            # Names must sort in creation order even if the clock stands still or steps back.
            ms = max(ms, _name_ms(os.path.basename(files[-1].path)) + 1)
        path = os.path.join(self.directory, _file_name(ms))
        f = IndexFile.create(path, self._slot_num, self._max, begin_phy_offset, begin_timestamp)
        files.append(f)
        return f

    def _newest_with_entries(self) -> IndexFile | None:
        files = self._open_files()
        if files and files[-1].index_count > 1:
            return files[-1]
        return next((f for f in reversed(self._open_files()) if f.index_count > 1), None)

    def _entries_at_offset(self, phy_offset: int) -> int:
        found = 0
        for f in reversed(self._open_files()):
            for _, _, phy, _ in f.iter_entries(reverse=True):
                if phy != phy_offset:
                    return found
                found += 1
        return found

    def build_index(
        self, topic: str, phy_offset: int, store_timestamp_ms: int, keys: Sequence[str]
    ) -> None:
        """Index one message's keys (UNIQ_KEY and the KEYS values); replays are no-ops."""
        self.build_index_many([(topic, phy_offset, store_timestamp_ms, [k.encode() for k in keys])])

    def build_index_many(self, messages: Sequence[tuple[str, int, int, Sequence[bytes]]]) -> None:
        """Index many messages' keys, (topic, offset, store timestamp, keys as stored) each, in
        log order; replays are no-ops. Headers are written once, at the end (dispatch's way)."""
        with self._lock:
            files = self._open_files()
            dirty: list[IndexFile] = []
            try:
                for topic, phy_offset, store_timestamp_ms, keys in messages:
                    hashes = [topic_key_hash(topic, k) for k in keys if k]
                    if hashes:
                        self._put(files, hashes, phy_offset, store_timestamp_ms, dirty)
            finally:
                for f in dirty:
                    f.write_header()

    def _put(
        self,
        files: list[IndexFile],
        hashes: list[int],
        phy_offset: int,
        store_timestamp_ms: int,
        dirty: list[IndexFile],
    ) -> None:
        newest = files[-1] if files and files[-1].index_count > 1 else self._newest_with_entries()
        if newest is not None and phy_offset <= newest.end_phy_offset:
            if phy_offset < newest.end_phy_offset:
                return
            # The last message may have been cut short by a kill between two of its keys;
            # keys go in in order, so the ones already there are a prefix.
            hashes = hashes[self._entries_at_offset(phy_offset) :]
        while hashes:
            f = files[-1] if files else self._create(phy_offset, store_timestamp_ms)
            if not dirty or dirty[-1] is not f:
                dirty.append(f)
            put = f.put_hashes(hashes, phy_offset, store_timestamp_ms)
            hashes = hashes[put:]
            if not hashes:
                break
            # Nothing writes to a full file again, so this is its last flush.
            f.write_header()
            f.flush()
            f = self._create(f.end_phy_offset, f.end_timestamp)
            dirty.append(f)
            if not f.put_hashes(hashes[:1], phy_offset, store_timestamp_ms):
                raise AssertionError(f"fresh index file {f.path} refused a key")
            hashes = hashes[1:]

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Offsets of messages whose key hash matches, newest first; collisions included."""
        with self._lock:
            full_key = f"{topic}#{key}"
            found: list[int] = []
            for f in reversed(self._open_files()):
                if len(found) >= max_num:
                    break
                if f.index_count <= 1:
                    continue  # an empty file's header range is not real
                if f.begin_timestamp <= end_ms and f.end_timestamp >= begin_ms:
                    found += f.select(full_key, begin_ms, end_ms, max_num - len(found))
                if f.begin_timestamp < begin_ms:
                    break
            return found

    def trim_to(self, phy_offset: int) -> None:
        """Forget every entry at or beyond ``phy_offset``, as if it had never been indexed."""
        with self._lock:
            files = self._open_files()
            while files:
                f = files[-1]
                first = next(f.iter_entries(), None)
                if f.begin_phy_offset >= phy_offset and (first is None or first[2] >= phy_offset):
                    files.pop().destroy()
                    continue
                f.trim_to(phy_offset)
                break

    def delete_files_below(self, min_phy_offset: int) -> int:
        """Retention: delete the oldest files whose every entry is below ``min_phy_offset``."""
        with self._lock:
            files = self._open_files()
            deleted = 0
            while len(files) > 1 and files[0].end_phy_offset < min_phy_offset:
                files.pop(0).destroy()
                deleted += 1
            return deleted

    def flush(self) -> None:
        with self._lock:
            files = self._open_files()
            # Only the newest file is ever written: a full one is flushed as it is left behind.
            if files:
                files[-1].flush()

    def close(self, flush: bool = True) -> None:
        """Unmap every file; ``flush=False`` leaves the newest file's dirty pages to whoever
        flushes next (a recovery handing the files to its helper process)."""
        with self._lock:
            if self._files is None:
                return
            files, self._files = self._files, None
            try:
                if files and flush:
                    files[-1].flush()
            finally:
                for f in files:
                    f.close()

    @property
    def files(self) -> list[IndexFile]:
        with self._lock:
            return list(self._open_files())

    @property
    def end_phy_offset(self) -> int:
        """End offset of the newest file that has entries, -1 when nothing is indexed."""
        with self._lock:
            newest = self._newest_with_entries()
            return -1 if newest is None else newest.end_phy_offset
