"""An ordered sequence of MappedFiles forming one logical byte log (CommitLog, or one
ConsumeQueue): find the file for a global offset, roll to the next, track wrote / flushed
positions, delete from the head, truncate dirty tails.

Not thread-safe by itself: the owner serialises appends; flushers and readers only read lists that
are replaced, never mutated in place, so they see a consistent snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.mapped_file import MappedFile, offset_to_name

log = logging.getLogger(__name__)


class MappedFileQueue:
    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []

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
        """A new empty file at ``base`` (the next after the last), appended to the queue."""
        os.makedirs(self.directory, exist_ok=True)
        f = MappedFile.create(
            os.path.join(self.directory, offset_to_name(base)), self.file_size, base
        )
        self.files = [*self.files, f]
        return f

    def set_positions(self, offset: int) -> None:
        """After recovery: every file before ``offset`` is full, the one holding it ends there."""
        for f in self.files:
            if f.end_offset <= offset:
                f.wrote = f.flushed = f.size
            elif f.base_offset <= offset:
                f.wrote = f.flushed = offset - f.base_offset
            else:
                f.wrote = f.flushed = 0

    # ----------------------------------------------------------------- flush
    def flush(self, least_pages: int = 0) -> int:
        """Flush the file holding the flush point (and any full ones before it). Returns the new
        flushed offset. ``least_pages`` > 0 skips a file with fewer dirty pages unless it is
        full."""
        for f in self.files:
            if f.flushed >= f.size:
                continue
            if f.wrote == f.flushed:
                break
            if least_pages and not f.is_full and f.dirty_pages() < least_pages:
                break
            f.flush()
            if not f.is_full:
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
                f.wrote = f.flushed = pos
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
