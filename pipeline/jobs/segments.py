"""CommitLog segment files: finding them, cutting them into splits, walking records.

A segment is a file copied from a broker's ``commitlog/`` directory, or a file of an archive
(docs/archive.md, ``pipeline.jobs.archive``), fetched whole and checked against its manifest
entry by the task that reads it: decompressed it is the CommitLog file byte for byte, and is
walked exactly as a local one.

No Spark here: the jobs and the ``tidemq_segments`` data source run these functions in executor
tasks. Records are decoded and checked with ``tidemq.storage.record``, the store's own codec.

A segment is named by the CommitLog offset of its first byte (20 digits), and every record
carries its own CommitLog offset (PHYSICALOFFSET). A split is a byte range of one file and owns
the records that *start* inside it. A task whose split starts mid-file finds its first record
by looking for a record magic whose PHYSICALOFFSET equals its own position and whose CRCs hold;
the same search steps over damage: after a corrupt record the walk continues at the next record
that checks out, and the bytes between are reported as one corrupt span.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from tidemq.pipeline.jobs.archive import ArchivedFile, ArchiveLocation, list_archive
from tidemq.storage.record import (
    BLANK,
    BLANK_MAGIC,
    CORRUPT,
    END_OF_FILE,
    HEADERS,
    MAGIC_V1,
    MAGIC_V2,
    OK,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    RecordInfo,
    check_record,
    make_msg_id,
)

SEGMENT_NAME: Final = re.compile(r"^\d{20}\Z")
_MAGICS: Final = tuple(m.to_bytes(4, "big") for m in (MAGIC_V1, MAGIC_V2, BLANK_MAGIC))
_BLANK_MAGIC_BYTES: Final = BLANK_MAGIC.to_bytes(4, "big")


class SegmentError(ValueError):
    """Paths that do not name CommitLog segment files."""


@dataclass(frozen=True, order=True)
class Segment:
    base_offset: int  # CommitLog offset of the file's first byte (its name)
    path: str  # a local path, or for an archived file its archive's URI + /segments/NAME
    size_bytes: int
    archived: ArchivedFile | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Split:
    segment: Segment
    start: int  # file positions [start, end)
    end: int


@dataclass(frozen=True)
class ScannedRecord:
    """A good record, or a corrupt span (``problem`` set, the decoded fields None)."""

    file: str
    file_offset: int
    phy_offset: int
    size: int
    problem: str | None = None
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    store_timestamp_ms: int | None = None
    born_timestamp_ms: int | None = None
    body_size: int | None = None
    tags: str | None = None
    keys: tuple[str, ...] = ()
    msg_id: str | None = None
    body: bytes | None = None  # only when asked for (``scan_split(include_body=True)``)


def segment_of(path: str) -> Segment:
    name = os.path.basename(path)
    if not SEGMENT_NAME.match(name):
        raise SegmentError(
            f"{path}: a CommitLog segment is named by its 20-digit base offset; the name is "
            "needed to check each record's own offset"
        )
    return Segment(int(name), os.path.abspath(path), os.path.getsize(path))


@dataclass(frozen=True)
class ArchiveContents:
    uri: str  # as the archive's backend spells it
    segments: list[Segment]  # its archived files, by base offset
    not_archived: list[str]  # names of the files its manifest records as not archived


def archived_segments(location: ArchiveLocation) -> ArchiveContents:
    """An archive's archived files as segments (listed from its manifest)."""
    listing = list_archive(location)
    segments = [Segment(f.entry.base_offset, f.path, f.entry.size_bytes, f) for f in listing.files]
    return ArchiveContents(listing.uri, segments, listing.not_archived)


@dataclass(frozen=True)
class Inputs:
    segments: list[Segment]  # sorted
    archives: list[ArchiveContents]


def find_inputs(paths: Sequence[str], archives: Sequence[ArchiveLocation] = ()) -> Inputs:
    """Segments named by ``paths`` (directories: their segment files, globs, or files) and the
    archived files of ``archives``. Each is listed once per name it is given by: a file that is
    both in a directory and in an archive is read twice."""
    found: dict[str, Segment] = {}
    listed = [archived_segments(location) for location in archives]
    for archive in listed:
        for seg in archive.segments:
            found[seg.path] = seg
    for p in paths:
        if os.path.isdir(p):
            names = [os.path.join(p, n) for n in sorted(os.listdir(p)) if SEGMENT_NAME.match(n)]
        elif glob.has_magic(p):
            names = [n for n in sorted(glob.glob(p)) if os.path.isfile(n)]
        elif os.path.isfile(p):
            names = [p]
        else:
            raise SegmentError(f"{p}: no such file or directory")
        for n in names:
            seg = segment_of(n)
            found[seg.path] = seg
    if not found:
        where = list(paths) + [a.uri for a in archives]
        raise SegmentError(f"no CommitLog segment files in {where}")
    return Inputs(sorted(found.values()), listed)


def find_segments(paths: Sequence[str], archives: Sequence[ArchiveLocation] = ()) -> list[Segment]:
    """``find_inputs``' segments."""
    return find_inputs(paths, archives).segments


def splits(segments: Sequence[Segment], split_bytes: int) -> list[Split]:
    """Local files cut into ``split_bytes`` pieces; an archived file is one split (its task
    fetches and checks the whole file before reading it)."""
    if split_bytes <= 0:
        raise SegmentError("split size must be > 0")
    out = []
    for seg in segments:
        step = max(seg.size_bytes, 1) if seg.archived is not None else split_bytes
        for start in range(0, max(seg.size_bytes, 1), step):
            out.append(Split(seg, start, min(start + step, seg.size_bytes)))
    return out


Contents = bytes | mmap.mmap


@contextlib.contextmanager
def contents(seg: Segment) -> Iterator[Contents]:
    """The segment's bytes: a local file mapped, an archived one fetched and checked (raises
    ``ArchiveInputError`` naming an object that fails its checks)."""
    if seg.archived is not None:
        yield seg.archived.fetch()
        return
    with open(seg.path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""  # mmap refuses an empty file
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield buf


def _find_record(buf: Contents, pos: int, before: int, limit: int, base: int) -> int | None:
    """The first position in [pos, before) where a whole, checked record (the file readable up
    to ``limit``) or an end-of-file blank starts; None when there is none."""
    search = pos + 4
    end = min(before + 4, limit)
    while True:
        hits = [h for h in (buf.find(m, search, end) for m in _MAGICS) if h >= 0]
        if not hits:
            return None
        at = min(hits) - 4
        search = at + 5
        if at < pos:
            continue
        if buf[at + 4 : at + 8] == _BLANK_MAGIC_BYTES:
            if BLANK.unpack_from(buf, at)[0] == limit - at:
                return at
            continue
        status, _ = check_record(buf, at, limit, True, base + at)
        if status == OK:
            return at


def _scanned(
    seg: Segment, buf: Contents, pos: int, info: RecordInfo, include_body: bool
) -> ScannedRecord:
    sys_flag = info.sys_flag
    hdr = HEADERS[bool(sys_flag & SYSFLAG_BORNHOST_V6), bool(sys_flag & SYSFLAG_STOREHOST_V6)]
    fields = hdr.unpack_from(buf, pos)
    keys = (
        tuple(k for k in info.keys.decode("utf-8", "replace").split(" ") if k) if info.keys else ()
    )
    body_at = pos + hdr.size
    return ScannedRecord(
        file=seg.path,
        file_offset=pos,
        phy_offset=info.phy_offset,
        size=info.size,
        topic=info.topic,
        queue_id=info.queue_id,
        queue_offset=info.queue_offset,
        store_timestamp_ms=info.store_timestamp_ms,
        born_timestamp_ms=fields[8],
        body_size=fields[16],
        tags=info.tags.decode("utf-8", "replace") if info.tags is not None else None,
        keys=keys,
        msg_id=make_msg_id((fields[12], fields[13]), info.phy_offset),
        body=bytes(buf[body_at : body_at + fields[16]]) if include_body else None,
    )


def scan_split(split: Split, *, include_body: bool = False) -> Iterator[ScannedRecord]:
    """Every record starting in ``split``, each CRC verified, and the corrupt spans between;
    with ``include_body`` the good records carry their bodies."""
    seg = split.segment
    if seg.size_bytes == 0:
        return
    with contents(seg) as buf:
        limit = len(buf)
        pos: int | None = split.start
        if split.start > 0:
            pos = _find_record(buf, split.start, split.end, limit, seg.base_offset)
        while pos is not None and pos < split.end:
            status, info = check_record(buf, pos, limit, True, seg.base_offset + pos)
            if status == OK:
                assert isinstance(info, RecordInfo)
                yield _scanned(seg, buf, pos, info, include_body)
                pos += info.size
                continue
            if status == END_OF_FILE:
                return
            following = _find_record(buf, pos + 1, limit, limit, seg.base_offset)
            if following is None and status != CORRUPT and buf[pos : pos + 8] == bytes(8):
                return  # zeros and nothing valid after them: the end of the data
            reason = str(info) if status == CORRUPT else f"incomplete record: {info}"
            end = limit if following is None else following
            yield ScannedRecord(seg.path, pos, seg.base_offset + pos, end - pos, problem=reason)
            pos = following


def data_end(seg: Segment) -> int:
    """File position where the segment's records end (its blank marker, zeros, or damage)."""
    if seg.size_bytes == 0:
        return 0
    with contents(seg) as buf:
        pos, limit = 0, len(buf)
        while True:
            status, info = check_record(buf, pos, limit, False, seg.base_offset + pos)
            if status == END_OF_FILE:
                return limit  # the blank marker and its padding are part of a full file
            if status != OK or not isinstance(info, RecordInfo):
                return pos
            pos += info.size


def record_at(seg: Segment, file_offset: int) -> ScannedRecord | None:
    """The record whose bytes include ``file_offset`` (walking from the file's start), or the
    corrupt span there; None past the end of the data."""
    split = Split(seg, 0, seg.size_bytes)
    for rec in scan_split(split):
        if rec.file_offset <= file_offset < rec.file_offset + rec.size:
            return rec
        if rec.file_offset > file_offset:
            return None
    return None
