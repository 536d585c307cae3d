"""The master's archiving pass (docs/archive.md): every sealed CommitLog file is archived as soon
as it is sealed, dispatched and held by every in-sync slave (so no failover truncation can cut
into it), whether or not retention wants it yet. Retention then deletes a local file only below
``floor()``: the end of the oldest run of local files that all have a manifest entry. An archive
that cannot be reached stops archiving and therefore deletion; nothing is lost, the disk fills.

A slave does not archive; its pass only reads the manifest its master writes, and its floor
comes from there (its CommitLog files have its master's base offsets, byte for byte).
"""

from __future__ import annotations

import json
import logging
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.storage.archive.config import ArchiveConfig
from tidemq.storage.archive.format import (
    OWNER_KEY,
    ArchiveCorruptError,
    ArchiveError,
    ArchiveOwnedError,
    ArchiveUnavailableError,
    Codec,
    segment_name,
)
from tidemq.storage.archive.reader import ArchiveReader
from tidemq.storage.archive.segments import archive_segment
from tidemq.storage.mapped_file import MappedFile
from tidemq.storage.parts import StoreParts

log = logging.getLogger(__name__)


@dataclass
class ArchiveCounts:
    """What archiving did since the store opened (the broker's ``tidemq_archive_*`` metrics)."""

    files_archived: int = 0
    files_skipped: int = 0  # sealed files no topic wanted archived (recorded, not uploaded)
    bytes_archived: int = 0  # uncompressed
    bytes_stored: int = 0  # as sent
    chunks_reused: int = 0  # found already uploaded (a resumed upload)
    failures: int = 0
    pending_files: int = 0  # sealed local files with no manifest entry yet
    last_error: str = ""
    seconds_spent: float = 0.0


class Archiver:
    def __init__(self, parts: StoreParts, config: ArchiveConfig, reader: ArchiveReader) -> None:
        self._parts = parts
        self.config = config
        self.reader = reader
        self._codec = Codec(config.compression, config.zstd_level)
        # The broker sets these: whether this store archives (a master) or only follows the
        # manifest (a slave); a topic's own policy (None: the default); the CommitLog offset
        # every in-sync slave holds (None: no slave to wait for).
        self.enabled: Callable[[], bool] = lambda: True
        self.topic_policy: Callable[[str], str | None] = lambda _topic: None
        self.safe_offset: Callable[[], int | None] = lambda: None
        self.counts = ArchiveCounts()
        # The broker group this archive is for (``_check_owner``); empty: not checked.
        self.owner = ""
        self._owner_checked = False
        # The store sets it: a pass stops between files once the store is closing.
        self.stopping: Callable[[], bool] = lambda: False
        self._failing = False
        self._refreshed = False
        self._run_lock = threading.Lock()  # the archiver thread and ``run_archive`` calls

    @property
    def reachable(self) -> bool:
        """Whether the last pass reached the archive."""
        return not self._failing

    def wants(self, topic: str) -> bool:
        return (self.topic_policy(topic) or self.config.default_policy) == "archive"

    def floor(self) -> int:
        """Retention may delete local CommitLog files that end at or below this offset: each of
        them, from the oldest on, has a manifest entry. Nothing until the manifest was read."""
        files = self._parts.commitlog.mfq.files
        if not files or not self._refreshed or (self.owner and not self._owner_checked):
            return self._parts.commitlog.min_offset
        floor = files[0].base_offset
        for f in files[:-1]:
            if not self.reader.has(segment_name(f.base_offset)):
                break
            floor = f.end_offset
        return floor

    def run(self) -> int:
        """One pass; returns how many files it archived or recorded."""
        with self._run_lock:
            return self._run()

    def _sealed_unarchived(self) -> list[MappedFile]:
        """Sealed files that no failover can cut and that have no manifest entry, oldest first."""
        p = self._parts
        safe = p.dispatcher.offset
        slave_floor = self.safe_offset()
        if slave_floor is not None:
            safe = min(safe, slave_floor)
        sealed = [f for f in p.commitlog.mfq.files[:-1] if f.end_offset <= safe]
        todo = [f for f in sealed if not self.reader.has(segment_name(f.base_offset))]
        self.counts.pending_files = len(todo)
        return todo

    def read_manifest(self) -> bool:
        """Read the manifest's new entries; False (logged, counted) when the archive cannot be
        read."""
        try:
            self._check_owner()
            self.reader.refresh()
        except ArchiveError as e:
            self._sealed_unarchived()
            self._failed(e)
            return False
        self._refreshed = True
        if self._failing and not self.enabled():
            self._failing = False  # a slave only reads: reading works again
            log.warning("archive %s works again", self.reader.backend.uri)
        return True

    def claim(self, owner: str) -> None:
        """Set the broker group this store archives for; the manifest counts for retention
        only once the archive is known to be that group's."""
        if owner != self.owner:
            self.owner = owner
            self._owner_checked = False
            self._refreshed = False

    def _check_owner(self) -> None:
        """An archive holds one broker group's CommitLog: ``owner.json`` names the group, written
        by the first master that archives. Another group's archive is refused (no archiving, no
        reads, no deletion): its files have the same names and other bytes."""
        if not self.owner or self._owner_checked:
            return
        raw = self.reader.backend.get(OWNER_KEY)
        if raw is None:
            if not self.enabled():
                return  # a slave waits for its master to claim it
            self.reader.backend.put(
                OWNER_KEY, json.dumps({"format_version": 1, "owner": self.owner}).encode()
            )
        else:
            try:
                found = str(json.loads(raw)["owner"])
            except (ValueError, KeyError, TypeError) as e:
                raise ArchiveCorruptError(f"archive {OWNER_KEY} is unreadable: {e}") from e
            if found != self.owner:
                self.reader.refused = (
                    f"archive {self.reader.backend.uri} belongs to broker group {found!r}, not "
                    f"{self.owner!r}: give each broker group its own archive URI"
                )
                raise ArchiveOwnedError(self.reader.refused)
        self._owner_checked = True

    def _run(self) -> int:
        if not self.read_manifest():
            return 0
        p = self._parts
        todo = self._sealed_unarchived()
        if not self.enabled():
            return 0
        done = 0
        for f in todo:
            if self.stopping():
                return done
            started = time.monotonic()
            try:
                # A mapping of its own, read-only: nothing is copied, and retention or a
                # truncation unmapping the store's mapping meanwhile does not pull the pages
                # from under the upload (the file lives on until this mapping closes).
                with open(f.path, "rb") as fh:
                    mm = mmap.mmap(fh.fileno(), f.size, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return done  # the file is gone (retention, a truncation): next pass
            try:
                with mm, memoryview(mm) as data:
                    entry, sent = archive_segment(
                        self.reader.backend,
                        data,
                        f.base_offset,
                        record_crc=p.commitlog.record_crc,
                        codec=self._codec,
                        chunk_bytes=self.config.chunk_bytes,
                        wants=self.wants,
                    )
            except ArchiveError as e:
                self._failed(e)
                return done
            self.reader.add(entry)
            done += 1
            self.counts.pending_files -= 1
            self.counts.seconds_spent += time.monotonic() - started
            if entry.archived:
                self.counts.files_archived += 1
                self.counts.bytes_archived += entry.size_bytes
                self.counts.bytes_stored += sent.bytes_sent
                self.counts.chunks_reused += sent.chunks_reused
                log.info(
                    "archived CommitLog file %s to %s (%d records, %d -> %d bytes%s)",
                    entry.name,
                    self.reader.backend.uri,
                    entry.records,
                    entry.size_bytes,
                    entry.stored_bytes,
                    f", {sent.chunks_reused} chunk(s) already there" if sent.chunks_reused else "",
                )
            else:
                self.counts.files_skipped += 1
            if self._failing:
                self._failing = False
                log.warning("archive %s works again", self.reader.backend.uri)
        return done

    def _failed(self, e: ArchiveError) -> None:
        self.counts.failures += 1
        self.counts.last_error = str(e)
        if isinstance(e, ArchiveUnavailableError):
            if not self._failing:
                log.warning(
                    "archive unreachable, archiving (and so retention's deletions) stopped "
                    "until it is back: %s",
                    e,
                )
            self._failing = True
        elif isinstance(e, ArchiveOwnedError):
            log.error("%s", e)
        elif isinstance(e, ArchiveCorruptError):
            log.error("archive check failed, the file stays local and is tried again: %s", e)
        else:
            log.error("CommitLog file not archived, retention keeps it: %s", e)
