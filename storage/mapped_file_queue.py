"""An ordered sequence of MappedFiles forming one logical byte log (CommitLog, or one
ConsumeQueue): find the file for a global offset, roll to the next, track wrote / committed /
flushed positions, delete from the head, truncate dirty tails.

Not thread-safe by itself: the owner serialises appends; flushers and readers only read lists that
are replaced, never mutated in place, so they see a consistent snapshot. Commits (with a
transient store pool) are serialised by ``commit_lock``.

The CommitLog's queue has page settings (``configure``): a transient store pool whose buffers new
files borrow, populating each new file whole (``warm_mapped_file``) and keeping the file being
written mlocked (``mlock_commitlog``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.mapped_file import MappedFile, offset_to_name
from tidemq.storage.pages import PageCounters
from tidemq.storage.transient_pool import TransientStorePool, WriteBuffer

log = logging.getLogger(__name__)


class MappedFileQueue:
    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        # Page settings (``configure``); a ConsumeQueue keeps these defaults.
        self.pool: TransientStorePool | None = None
        self.populate_new = False
        self.lock_active = False
        self.counters = PageCounters()
        # Re-entrant: a truncation commits what is pending while it holds it.
        self.commit_lock = threading.RLock()
        self.commits = 0  # commits that moved the committed position

    def configure(
        self,
        *,
        pool: TransientStorePool | None,
        populate_new: bool,
        lock_active: bool,
        counters: PageCounters,
    ) -> None:
        self.pool = pool
        self.populate_new = populate_new
        self.lock_active = lock_active
        self.counters = counters

    def load(self) -> None:
        """Map every file, all marked full; recovery then corrects the tail (spec §1.1)."""
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 20)
        if names:
            last = os.path.join(self.directory, names[-1])
            # A zero-length last file is a creation that crashed before allocating.
            if os.path.getsize(last) == 0:
                os.unlink(last)
                names.pop()
        files: list[MappedFile] = []
        try:
            for name in names:
                base = int(name)
                if base % self.file_size:
                    raise CorruptStoreError(
                        f"{self.directory}/{name}: offset is not a multiple of the file size "
                        f"{self.file_size}"
                    )
                if files and base != files[-1].end_offset:
                    raise CorruptStoreError(
                        f"{self.directory}: file {name} does not follow "
                        f"{offset_to_name(files[-1].base_offset)} (a file is missing)"
                    )
                files.append(MappedFile(os.path.join(self.directory, name), self.file_size, base))
        except BaseException:
            for f in files:
                f.close()
            raise
        self.files = files

    # ----------------------------------------------------------------- positions
    @property
    def min_offset(self) -> int:
        return self.files[0].base_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Global offset of the next byte to write."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.base_offset + last.wrote

    @property
    def committed_offset(self) -> int:
        """Global offset of the end of what the files hold: what readers may see. Only the
        newest files can hold uncommitted bytes (commits go in order), so the walk starts at the
        last file and goes back while the one before is not wholly committed; without a pool
        that is never, and this is ``max_offset``."""
        files = self.files
        if not files:
            return 0
        i = len(files) - 1
        while i > 0 and files[i - 1].committed < files[i - 1].size:
            i -= 1
        f = files[i]
        return f.base_offset + f.committed

    @property
    def flushed_offset(self) -> int:
        for f in self.files:
            if f.flushed < f.size:
                return f.base_offset + f.flushed
        return self.files[-1].end_offset if self.files else 0

    @property
    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find_file(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        idx = offset // self.file_size - files[0].base_offset // self.file_size
        if 0 <= idx < len(files):
            return files[idx]
        return None

    def file_for_append(self, start_offset: int = 0) -> MappedFile:
        """The last file if it has room, else a newly created next file."""
        last = self.last_file
        if last is not None and not last.is_full:
            return last
        base = last.end_offset if last is not None else start_offset - start_offset % self.file_size
        return self.create_file(base)

    def create_file(self, base: int) -> MappedFile:
        """A new empty file at ``base`` (the next after the last), appended to the queue, with
        the queue's page settings applied: a pool buffer borrowed, the file populated whole, the
        file mlocked and the one before unlocked. All in the creating thread (the writer, under
        the put lock: the store has no allocation thread), so populating and locking a file are
        a pause of the writer at every roll."""
        os.makedirs(self.directory, exist_ok=True)
        f = MappedFile.create(
            os.path.join(self.directory, offset_to_name(base)), self.file_size, base
        )
        try:
            self._prepare(f)
        except BaseException:
            f.destroy()
            raise
        prev = self.files[-1] if self.files else None
        self.files = [*self.files, f]
        f.advise_appending(True)
        if prev is not None:
            prev.advise_appending(False)
            if self.lock_active:
                prev.unlock()
        return f

    def _prepare(self, f: MappedFile) -> None:
        pool = self.pool
        if pool is not None:
            buf = pool.borrow()
            if buf is None:
                pool.note_miss()
                buf = self._free_a_buffer()
            if buf is not None:
                f.attach_buffer(buf, pool.give_back)
        if self.populate_new:
            f.warm(0, f.size)
        if self.lock_active:
            self._lock(f)

    def _free_a_buffer(self) -> WriteBuffer | None:
        """Every buffer is in use: commit everything pending, then every file gives its buffer
        back (nothing is left in one) and goes on directly, and the new file takes one.

        Direct writes reach the disk as they are written, so a file written directly must never
        follow a file whose bytes are still only in a buffer: a crash could keep the later bytes
        and lose the earlier ones, a hole recovery cannot cut. A batch that spans several new
        files writes the ones before the new file too, hence all of them, not only the last."""
        assert self.pool is not None
        with self.commit_lock:
            self.commit(0)
            for f in self.files:
                buf = f.take_buffer()
                if buf is not None:
                    self.pool.give_back(buf)
            return self.pool.borrow()

    def _lock(self, f: MappedFile) -> None:
        err = f.lock()
        if err:
            self.counters.mlock_failed(f"CommitLog file {f.path}", err)

    def prepare_tail(self) -> None:
        """At start, after recovery: the file being written gets the page settings a new file
        gets (a pool buffer, the lock); populating it whole is left to the page warmer."""
        f = self.last_file
        if f is None or f.is_full:
            return
        if self.pool is not None and not f.has_buffer:
            buf = self.pool.borrow()
            if buf is not None:
                f.attach_buffer(buf, self.pool.give_back)
        if self.lock_active:
            self._lock(f)

    def set_positions(self, offset: int) -> None:
        """After recovery: every file before ``offset`` is full, the one holding it ends there."""
        for f in self.files:
            if f.end_offset <= offset:
                f.set_positions(f.size)
            elif f.base_offset <= offset:
                f.set_positions(offset - f.base_offset)
            else:
                f.set_positions(0)

    # ----------------------------------------------------------------- commit / flush
    def commit(self, least_pages: int = 0) -> int:
        """Copy what the write buffers hold past each file's committed position into the files,
        oldest first; returns the committed offset. ``least_pages`` > 0 skips a file with fewer
        new pages unless it is full. Without a pool there is nothing to copy."""
        if self.pool is None:
            return self.max_offset
        with self.commit_lock:
            before = self.committed_offset
            files = self.files
            i = len(files) - 1
            while i > 0 and files[i - 1].committed < files[i - 1].size:
                i -= 1
            for f in files[max(i, 0) :]:
                if f.commit(least_pages) < f.size:
                    break
            after = self.committed_offset
            if after > before:
                self.commits += 1
            return after

    def flush(self, least_pages: int = 0) -> int:
        """Commit whatever a write buffer holds, then flush the file holding the flush point
        (and any full ones before it). Returns the new flushed offset. ``least_pages`` > 0 skips
        a file with fewer dirty pages unless it is full. Committing first makes a flush mean
        "everything appended so far", with or without a pool."""
        if self.pool is not None:
            self.commit(0)
        for f in self.files:
            if f.flushed >= f.size:
                continue
            if f.committed == f.flushed:
                break
            if least_pages and not f.is_full and f.dirty_pages() < least_pages:
                break
            if f.flush() < f.size:
                break
        return self.flushed_offset

    # ----------------------------------------------------------------- truncation / deletion
    def truncate(
        self,
        offset: int,
        evidence: Callable[[int, bytes], None] | None = None,
        *,
        exact: bool = False,
    ) -> None:
        """Cut the log at ``offset``: zero the rest of its file, delete files beyond it.

        Bytes removed are handed to ``evidence(global_offset, bytes)`` before they are destroyed.
        ``exact`` says the wrote positions are true (a running store), so evidence is exactly the
        bytes written; otherwise (recovery) data ends at the last non-zero byte.
        """
        with self.commit_lock:  # no commit in flight while files are cut and closed
            self._truncate(offset, evidence, exact)

    def _truncate(
        self, offset: int, evidence: Callable[[int, bytes], None] | None, exact: bool
    ) -> None:
        # Whatever a write buffer holds goes into the files first: evidence is read from them.
        self.commit(0)
        keep: list[MappedFile] = []
        cuts: list[tuple[MappedFile, int, bytes]] = []  # (file, position in it, bytes removed)
        for f in self.files:
            if f.end_offset <= offset:
                keep.append(f)
                continue
            pos = offset - f.base_offset if f.base_offset <= offset else 0
            cuts.append((f, pos, f.tail_bytes(pos, f.wrote if exact else None)))
            if f.base_offset <= offset and not (f.base_offset == offset and keep):
                keep.append(f)
        # Evidence is on disk before a single byte is destroyed: a crash in between loses nothing.
        if evidence is not None:
            for f, pos, data in cuts:
                if data:
                    evidence(f.base_offset + pos, data)
        for f, pos, data in cuts:
            if f in keep:
                f.zero(pos, len(data))
                f.set_positions(pos)
            else:
                f.destroy()
        self.files = keep

    def delete_head(self, count: int) -> list[MappedFile]:
        """Delete the first ``count`` files; the last file is never deleted."""
        count = min(count, len(self.files) - 1)
        if count <= 0:
            return []
        gone, self.files = self.files[:count], self.files[count:]
        for f in gone:
            f.destroy()
        return gone

    def destroy(self) -> None:
        for f in self.files:
            f.destroy()
        self.files = []
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)

    def close(self) -> None:
        for f in self.files:
            f.close()
