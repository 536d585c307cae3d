"""``tidemq archive list|verify|restore``: offline tools for a broker's archive (docs/archive.md).

Registered with the ``tidemq`` CLI through the ``tidemq.commands`` entry point, like ``tidemq
store``. The archive is named as a broker names it (``--archive``: a path, ``file:///PATH`` or
``s3://BUCKET/PREFIX``; ``--s3-endpoint`` or ``AWS_ENDPOINT_URL`` for a store other than AWS).

Exit codes: 0 done; 1 the archive or the store says no (a corrupt or missing archived file, a
restore refused), named on stderr as ``tidemq: CODE: message``; 2 the command could not run (the
archive unreachable, a bad argument, the store directory in use).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tidemq.storage import state_file
from tidemq.storage.archive.backends import ArchiveBackend, open_backend
from tidemq.storage.archive.format import (
    MANIFEST_PREFIX,
    ArchiveCorruptError,
    ArchiveError,
    ManifestEntry,
    SegmentNotArchivableError,
    scan_segment,
    segment_name,
)
from tidemq.storage.archive.segments import fetch_chunk, read_entry, verify_segment
from tidemq.storage.atomic_file import fsync_dir, write_json_atomic
from tidemq.storage.config import StoreConfig
from tidemq.storage.errors import StoreError
from tidemq.storage.lock import StoreLock
from tidemq.storage.manifest import FORMAT_VERSION, LAYOUT_FILE
from tidemq.storage.record import OK, check_record

Command = Callable[[argparse.Namespace], int]

# store.json's keys besides format_version (manifest.check_layout writes and compares them).
LAYOUT_KEYS = (
    "commitlog_file_size_bytes",
    "consume_queue_entries_per_file",
    "index_slot_num",
    "index_max_num",
    "record_crc",
)
# Files a store writes when it opens: their presence means it has been opened (derived state).
_OPENED_MARKS = ("checkpoint", "consumequeue", "index")


class RestoreRefusedError(StoreError):
    """``restore`` will not write what was asked: it would overwrite a different file, leave a
    gap in the CommitLog, or give the store a layout it cannot read. Raised before anything is
    written."""

    code = "RESTORE_REFUSED"


def exits_on_archive_error(command: Command) -> Command:
    """``command`` with errors reported as one line on stderr: exit 1 for what the archive or
    the store refuses (corrupt, refused), 2 for what kept the command from running."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (ArchiveCorruptError, RestoreRefusedError) as e:
            print(f"tidemq: {e.code}: {e}", file=sys.stderr)
            return 1
        except StoreError as e:  # ArchiveUnavailableError, a bad URI, a locked store, ...
            print(f"tidemq: {e.code}: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # the store directory: not writable, the disk full, ...
            print(f"tidemq: OS_ERROR: {e}", file=sys.stderr)
            return 2

    return run


# ===================================================================== the manifest


@dataclass(frozen=True)
class Listed:
    """One ``manifest/N.json``: its entry, or why it cannot be read."""

    key: str
    base_offset: int  # from the key's name
    entry: ManifestEntry | None
    problem: str = ""


def _backend(args: argparse.Namespace) -> ArchiveBackend:
    return open_backend(args.archive, args.s3_endpoint or None)


def read_manifest(backend: ArchiveBackend) -> list[Listed]:
    """Every manifest entry, by base offset. An entry that cannot be read (or names another
    file than its key does) is listed with its problem rather than ending the walk; an archive
    that cannot be reached raises ``ArchiveUnavailableError``."""
    out: list[Listed] = []
    for key in backend.list(MANIFEST_PREFIX):
        name = key[len(MANIFEST_PREFIX) :].removesuffix(".json")
        if not key.endswith(".json") or not (name.isdigit() and len(name) == 20):
            continue  # not an entry (the format names them by 20-digit offsets)
        base = int(name)
        try:
            entry = read_entry(backend, key)
        except ArchiveCorruptError as e:
            out.append(Listed(key, base, None, str(e)))
            continue
        if entry.name != name or entry.base_offset != base:
            problem = (
                f"archive manifest entry {key} describes file {entry.name} "
                f"(base offset {entry.base_offset})"
            )
            out.append(Listed(key, base, None, problem))
            continue
        out.append(Listed(key, base, entry))
    return sorted(out, key=lambda e: e.base_offset)


def _in_range(listed: list[Listed], lo: int, hi: int | None) -> list[Listed]:
    """Entries whose file overlaps CommitLog offsets [lo, hi); an unreadable entry by the
    offset its key names."""
    out = []
    for item in listed:
        end = item.entry.end_offset if item.entry is not None else item.base_offset + 1
        if end > lo and (hi is None or item.base_offset < hi):
            out.append(item)
    return out


def _check_range(args: argparse.Namespace) -> tuple[int, int | None]:
    lo = args.from_offset if args.from_offset is not None else 0
    hi = args.to_offset
    if lo < 0 or (hi is not None and hi <= lo):
        raise ArchiveError(
            f"--from-offset {lo} / --to-offset {hi}: need 0 <= from < to (CommitLog offsets)"
        )
    return lo, hi


def _stamp(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _queues(entry: ManifestEntry) -> int:
    return sum(len(qs) for qs in entry.queues.values())


# ===================================================================== list


def _as_json(item: Listed) -> dict[str, Any]:
    e = item.entry
    if e is None:
        return {"name": segment_name(item.base_offset), "key": item.key, "error": item.problem}
    doc: dict[str, Any] = {
        "name": e.name,
        "base_offset": e.base_offset,
        "end_offset": e.end_offset,
        "archived": e.archived,
        "size_bytes": e.size_bytes,
        "archived_at_ms": e.archived_at_ms,
    }
    if e.archived:
        doc.update(
            data_end_offset=e.data_end_offset,
            records=e.records,
            stored_bytes=e.stored_bytes,
            ratio=round(e.stored_bytes / e.size_bytes, 4) if e.size_bytes else None,
            compression=e.compression,
            chunks=len(e.chunks),
            first_store_ms=e.first_store_ms,
            last_store_ms=e.last_store_ms,
            topics=len(e.queues),
            queues=_queues(e),
        )
    return doc


def _as_row(item: Listed) -> list[str]:
    e = item.entry
    if e is None:
        return [segment_name(item.base_offset), "", "UNREADABLE", "", "", "", item.problem]
    span = f"[{e.base_offset}, {e.end_offset})"
    if not e.archived:
        return [e.name, span, "skipped", "", f"{e.size_bytes} -> 0", "", "(policy delete)"]
    ratio = f"{e.stored_bytes / e.size_bytes:.1%}" if e.size_bytes else "-"
    return [
        e.name,
        span,
        "archived",
        str(e.records),
        f"{e.size_bytes} -> {e.stored_bytes} ({ratio}, {e.compression})",
        f"{_stamp(e.first_store_ms)} .. {_stamp(e.last_store_ms)}" if e.records else "",
        f"{len(e.queues)} topic(s), {_queues(e)} queue(s)",
    ]


def _table(header: list[str], rows: list[list[str]]) -> Iterator[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        yield "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()


@exits_on_archive_error
def cmd_archive_list(args: argparse.Namespace) -> int:
    backend = _backend(args)
    lo, hi = _check_range(args)
    listed = _in_range(read_manifest(backend), lo, hi)
    unreadable = [i for i in listed if i.entry is None]
    if args.json:
        for item in listed:
            print(json.dumps(_as_json(item)))
    elif not listed:
        print(f"archive {backend.uri}: no manifest entries" + (" in that range" if hi else ""))
    else:
        header = ["FILE", "COMMITLOG", "STATE", "RECORDS", "BYTES -> STORED", "STORED AT", ""]
        for line in _table(header, [_as_row(i) for i in listed]):
            print(line)
        entries = [i.entry for i in listed if i.entry is not None]
        archived = [e for e in entries if e.archived]
        size = sum(e.size_bytes for e in archived)
        stored = sum(e.stored_bytes for e in archived)
        print(
            f"archive {backend.uri}: {len(entries)} file(s), {len(archived)} archived, "
            f"{len(entries) - len(archived)} skipped"
            + (f", {len(unreadable)} unreadable" if unreadable else "")
            + (
                f"; {sum(e.records for e in archived)} records, {size} -> {stored} bytes"
                if archived
                else ""
            )
        )
    if unreadable:
        print(
            f"tidemq: {ArchiveCorruptError.code}: unreadable manifest entries: "
            + ", ".join(i.key for i in unreadable),
            file=sys.stderr,
        )
        return 1
    return 0


# ===================================================================== verify


@exits_on_archive_error
def cmd_archive_verify(args: argparse.Namespace) -> int:
    backend = _backend(args)
    lo, hi = _check_range(args)
    listed = _in_range(read_manifest(backend), lo, hi)
    ok = skipped = 0
    bad: list[str] = []  # file names, corrupt or missing
    prev_end: int | None = None
    for item in listed:
        name = segment_name(item.base_offset)
        if prev_end is not None and item.base_offset > prev_end:
            # Entries are written oldest first and never removed: a hole is a lost entry.
            first_missing = segment_name(prev_end)
            print(
                f"{first_missing} MISSING: no manifest entry for CommitLog offsets "
                f"[{prev_end}, {item.base_offset})"
            )
            bad.append(first_missing)
        e = item.entry
        prev_end = e.end_offset if e is not None else None  # an unreadable entry's end: unknown
        if e is None:
            print(f"{name} CORRUPT: {item.problem}")
            bad.append(name)
            continue
        if not e.archived:
            print(f"{name} skipped: no topic in it is archived (policy delete); nothing to check")
            skipped += 1
            continue
        try:
            # Every CRC a record carries is checked (the archive does not say whether the store
            # required them; the chunks' MD5s and the file's SHA-256 cover every byte anyway).
            verify_segment(backend, e, record_crc=False)
        except ArchiveCorruptError as err:
            print(f"{name} CORRUPT: {err}")
            bad.append(name)
            continue
        print(f"{name} ok: {e.records} records, {len(e.chunks)} chunk(s), {e.size_bytes} bytes")
        ok += 1
    print(
        f"archive {backend.uri}: {len(listed)} file(s) checked: {ok} ok, {skipped} skipped, "
        f"{len(bad)} corrupt or missing"
    )
    if bad:
        print(
            f"tidemq: {ArchiveCorruptError.code}: archived CommitLog files corrupt or missing: "
            + ", ".join(bad),
            file=sys.stderr,
        )
        return 1
    return 0


# ===================================================================== restore


def _local_files(commitlog: str) -> list[str]:
    """The CommitLog file names in ``commitlog`` (as ``MappedFileQueue.load`` sees them)."""
    if not os.path.isdir(commitlog):
        return []
    return sorted(n for n in os.listdir(commitlog) if n.isdigit() and len(n) == 20)


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_layout(path: str) -> dict[str, Any]:
    if os.path.isdir(path):  # a store directory: its layout
        path = os.path.join(path, LAYOUT_FILE)
    fix = f"give a {LAYOUT_FILE} written by a tidemq store"
    got = state_file.load(path, dict[str, Any], fix)
    if got is None:
        raise RestoreRefusedError(f"{path}: no such file")
    return got


def _select(listed: list[Listed], lo: int, hi: int | None, explicit: bool) -> list[ManifestEntry]:
    """The archived files to restore: those overlapping [lo, hi), which must be one contiguous
    run of archived files. Without bounds given, files no topic wanted archived (policy
    ``delete``) at either end of the archive are left out; within the range they are refused."""
    chosen = _in_range(listed, lo, hi)
    for item in chosen:
        if item.entry is None:
            raise RestoreRefusedError(
                f"cannot restore {segment_name(item.base_offset)}: {item.problem}"
            )
    entries = [i.entry for i in chosen if i.entry is not None]
    if not explicit:
        while entries and not entries[0].archived:
            entries.pop(0)
        while entries and not entries[-1].archived:
            entries.pop()
    if not entries:
        where = f"CommitLog [{lo}, {'...' if hi is None else hi})" if explicit else "the archive"
        raise RestoreRefusedError(f"no archived CommitLog file in {where}")
    runs: list[list[ManifestEntry]] = [[]]
    problem = ""
    prev: ManifestEntry | None = None
    for e in entries:
        if prev is not None and e.base_offset != prev.end_offset:
            problem = problem or (
                f"no manifest entry for CommitLog offsets [{prev.end_offset}, {e.base_offset})"
            )
            runs.append([])
        if not e.archived:
            problem = problem or (
                f"file {e.name} (CommitLog [{e.base_offset}, {e.end_offset})) was not archived: "
                f"the retention policy of its topics is delete"
            )
            runs.append([])
        else:
            runs[-1].append(e)
        prev = e
    if problem:
        pieces = ", ".join(f"[{r[0].base_offset}, {r[-1].end_offset})" for r in runs if r)
        raise RestoreRefusedError(
            f"the range is not one contiguous run of archived files: {problem}. A store's "
            f"CommitLog cannot have holes: restore one run with --from-offset/--to-offset "
            f"(the archived runs in that range: {pieces or 'none'})"
        )
    sizes = {e.size_bytes for e in entries}
    if len(sizes) != 1:
        raise RestoreRefusedError(f"the archived files have different sizes {sorted(sizes)}")
    return entries


def _plan_layout(root: str, file_size: int, layout_from: str | None) -> tuple[dict[str, Any], bool]:
    """The store's layout (store.json) and whether it must be written: the store's own when it
    has one (its CommitLog file size must be the archive's), else ``--layout-from``'s, else
    StoreConfig's defaults with the archive's file size."""
    path = os.path.join(root, LAYOUT_FILE)
    given = _read_layout(layout_from) if layout_from else None
    if given is not None and given.get("commitlog_file_size_bytes") != file_size:
        raise RestoreRefusedError(
            f"{layout_from} has commitlog_file_size_bytes "
            f"{given.get('commitlog_file_size_bytes')}, the archived files are {file_size} bytes"
        )
    if os.path.exists(path) or os.path.exists(f"{path}.bak"):
        have = _read_layout(path)
        if have.get("commitlog_file_size_bytes") != file_size:
            raise RestoreRefusedError(
                f"{path} has commitlog_file_size_bytes {have.get('commitlog_file_size_bytes')}, "
                f"the archived files are {file_size} bytes: this store cannot hold them (restore "
                f"into a new directory)"
            )
        if given is not None:
            diff = {
                k: (have.get(k), given.get(k)) for k in LAYOUT_KEYS if have.get(k) != given.get(k)
            }
            if diff:
                raise RestoreRefusedError(
                    f"{path} differs from --layout-from {layout_from} (store, given): {diff}"
                )
        return have, False
    if given is not None:
        missing = [k for k in LAYOUT_KEYS if k not in given]
        if missing:
            raise RestoreRefusedError(f"{layout_from} lacks {missing}")
        layout = {k: given[k] for k in LAYOUT_KEYS}
    else:
        defaults = StoreConfig(root, commitlog_file_size_bytes=file_size)
        layout = {k: getattr(defaults, k) for k in LAYOUT_KEYS}
    # What manifest.check_layout writes for a new store (and compares at every open).
    return {"format_version": FORMAT_VERSION, **layout}, True


def _is_sealed(path: str, base_offset: int, record_crc: bool) -> tuple[bool, str]:
    """Whether a local CommitLog file is complete (every record checks and it ends with a blank
    marker or at its last record), as a file the archiver archives must be."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        scan_segment(data, base_offset, record_crc, len(data) or 1)
    except SegmentNotArchivableError as e:
        return False, str(e)
    return True, ""


def _records_fit_layout(data: bytes, base_offset: int, record_crc: bool) -> str | None:
    """Why the store would refuse the first record of an archived file under a layout whose
    record_crc is ``record_crc`` (None: it would not)."""
    status, info = check_record(data, 0, len(data), True, base_offset, record_crc)
    if status == OK or info is None:  # a record, or a file that is one blank marker
        return None
    return str(info)


def _fetch_to(
    backend: ArchiveBackend, entry: ManifestEntry, tmp: str, on_first: Callable[[bytes], None]
) -> None:
    """Write the archived file into ``tmp`` a chunk at a time, each chunk checked (its MD5 and
    size) as it arrives and the whole file's size and SHA-256 at the end, as ``fetch_segment``
    checks them, then fsync it. Memory: one chunk, not the file."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        for i in range(len(entry.chunks)):
            chunk = fetch_chunk(backend, entry, i)
            if i == 0:
                on_first(chunk)
            h.update(chunk)
            size += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        if size != entry.size_bytes or h.hexdigest() != entry.sha256:
            raise ArchiveCorruptError(
                f"archived CommitLog file {entry.name} fails its checksum (SHA-256 of the file)"
            )
        os.fsync(fd)
    finally:
        os.close(fd)


@exits_on_archive_error
def cmd_archive_restore(args: argparse.Namespace) -> int:
    backend = _backend(args)
    lo, hi = _check_range(args)
    explicit = args.from_offset is not None or args.to_offset is not None
    entries = _select(read_manifest(backend), lo, hi, explicit)
    file_size = entries[0].size_bytes
    first, end = entries[0].base_offset, entries[-1].end_offset

    root = os.path.abspath(args.to)
    commitlog = os.path.join(root, "commitlog")
    os.makedirs(root, exist_ok=True)
    lock = StoreLock(root)
    lock.acquire()  # a running broker holds it: never write under a live store
    try:
        local = _local_files(commitlog)
        if local and not (
            os.path.exists(os.path.join(root, LAYOUT_FILE))
            or os.path.exists(os.path.join(root, LAYOUT_FILE + ".bak"))
        ):
            raise RestoreRefusedError(
                f"{root} holds a CommitLog but no {LAYOUT_FILE}: the store cannot be opened as "
                f"it is; copy its {LAYOUT_FILE} back first"
            )
        layout, write_layout = _plan_layout(root, file_size, args.layout_from)
        record_crc = bool(layout.get("record_crc", True))

        # What the store holds, and how the archived range meets it.
        todo: list[ManifestEntry] = []
        same: list[ManifestEntry] = []
        if local:
            have_lo, have_hi = int(local[0]), int(local[-1]) + file_size
            for prev, name in itertools.pairwise(local):
                if int(name) != int(prev) + file_size:
                    raise RestoreRefusedError(
                        f"{commitlog} has a hole after {prev} (next file {name}): the store "
                        "cannot be opened as it is; nothing restored"
                    )
            if end < have_lo or first > have_hi:
                gap = (end, have_lo) if end < have_lo else (have_hi, first)
                raise RestoreRefusedError(
                    f"the store holds CommitLog [{have_lo}, {have_hi}) and the archived range is "
                    f"[{first}, {end}): restoring it would leave [{gap[0]}, {gap[1]}) missing. "
                    f"The restored range must overlap or adjoin what the store has"
                )
            if first < have_lo and any(
                os.path.exists(os.path.join(root, m)) for m in _OPENED_MARKS
            ):
                raise RestoreRefusedError(
                    f"the store holds CommitLog [{have_lo}, {have_hi}) and has been opened "
                    f"(it has its ConsumeQueues, index and checkpoint): files below {have_lo} "
                    f"would not be indexed (recovery starts at the checkpoint and reads nothing "
                    f"below it), so their messages could not be consumed. Restore into a new "
                    f"directory, or from {have_hi} on"
                )
            for e in entries:
                path = os.path.join(commitlog, e.name)
                if not os.path.exists(path):
                    todo.append(e)
                elif os.path.getsize(path) == e.size_bytes and _sha256_of(path) == e.sha256:
                    same.append(e)
                else:
                    raise RestoreRefusedError(
                        f"{path} exists and differs from the archived file {e.name} (its size or "
                        f"SHA-256): refusing to overwrite it; nothing restored"
                    )
            above = [e for e in todo if e.base_offset >= have_hi]
            if above:
                last = os.path.join(commitlog, local[-1])
                sealed, why = _is_sealed(last, int(local[-1]), record_crc)
                if not sealed:
                    raise RestoreRefusedError(
                        f"the store's last CommitLog file {local[-1]} is not complete ({why}): "
                        f"archived files cannot follow it (its writer may still be appending; "
                        f"a file is archived only once sealed). Restore below it, or into a "
                        f"new directory"
                    )
            # Below the store's files: newest first, so what is on disk stays contiguous
            # if the restore stops half way; above: oldest first.
            below = [e for e in todo if e.base_offset < have_lo]
            todo = [*reversed(below), *above]
        else:
            todo = list(entries)

        # Checked: now write. store.json first (a store refuses a CommitLog without one).
        checked_layout = not write_layout

        def check_first(chunk: bytes, e: ManifestEntry) -> None:
            nonlocal checked_layout
            if checked_layout:
                problem = _records_fit_layout(chunk, e.base_offset, record_crc)
                if problem is not None:
                    raise RestoreRefusedError(
                        f"archived file {e.name}: the store's layout has record_crc "
                        f"{str(record_crc).lower()} and its first record fails it ({problem}); "
                        f"give a matching layout with --layout-from"
                    )
                return
            # A new store.json: record_crc as the records are written (with or without the
            # record CRC property), the store's default when they carry it.
            if layout["record_crc"] and _records_fit_layout(chunk, e.base_offset, True):
                if args.layout_from:
                    raise RestoreRefusedError(
                        f"archived file {e.name}: its records carry no record CRC property but "
                        f"{args.layout_from} says record_crc true"
                    )
                layout["record_crc"] = False
            write_json_atomic(os.path.join(root, LAYOUT_FILE), layout)
            print(f"wrote {os.path.join(root, LAYOUT_FILE)}: {json.dumps(layout, sort_keys=True)}")
            checked_layout = True

        for e in same:
            print(f"{e.name} skipped: already in {commitlog}, identical")
        written: list[ManifestEntry] = []
        os.makedirs(commitlog, exist_ok=True)
        for e in todo:
            path = os.path.join(commitlog, e.name)
            tmp = os.path.join(commitlog, f".{e.name}.restoring")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # left by a restore that was killed
            try:
                _fetch_to(backend, e, tmp, functools.partial(check_first, e=e))
                if os.path.exists(path):  # the lock is held: only if something ignored it
                    raise RestoreRefusedError(f"{path} appeared while restoring; not replaced")
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                if written:
                    print(
                        f"stopped after restoring {len(written)} file(s); what was written is "
                        f"checked and kept: running the same restore again goes on from there",
                        file=sys.stderr,
                    )
                raise
            fsync_dir(commitlog)
            written.append(e)
            print(f"{e.name} restored: {e.records} records, {e.size_bytes} bytes")
    finally:
        lock.release()
    print(
        f"restored {len(written)} file(s) ({len(same)} already there) of CommitLog "
        f"[{first}, {end}) from {backend.uri} into {commitlog}; the store rebuilds its "
        f"ConsumeQueues and index from them when it opens"
    )
    return 0


# ===================================================================== parser


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    archive = sub.add_parser(
        "archive", help="list, verify and restore a broker's archive (docs/archive.md)"
    )
    asub = archive.add_subparsers(dest="archive_command", required=True)

    def common(p: argparse.ArgumentParser, *, ranged: bool = True) -> None:
        p.add_argument(
            "--archive",
            required=True,
            metavar="URI",
            help="the archive: a directory path, file:///PATH or s3://BUCKET/PREFIX",
        )
        p.add_argument(
            "--s3-endpoint",
            metavar="URL",
            default="",
            help="an S3-compatible endpoint other than AWS (default: AWS_ENDPOINT_URL, else AWS)",
        )
        if ranged:
            p.add_argument(
                "--from-offset",
                type=int,
                metavar="N",
                help="only files holding CommitLog offsets from N on",
            )
            p.add_argument(
                "--to-offset", type=int, metavar="N", help="only files holding offsets below N"
            )

    ls = asub.add_parser("list", help="every archived CommitLog file (the manifest)")
    common(ls)
    ls.add_argument("--json", action="store_true", help="one JSON object per file")
    ls.set_defaults(func=cmd_archive_list)

    v = asub.add_parser(
        "verify", help="read every archived file back and check all of it (checksums, records)"
    )
    common(v)
    v.set_defaults(func=cmd_archive_verify)

    r = asub.add_parser(
        "restore",
        help="write archived CommitLog files into a store directory (a slave, a new broker group)",
    )
    common(r)
    r.add_argument("--to", required=True, metavar="STORE_DIR", help="the store directory")
    r.add_argument(
        "--layout-from",
        metavar="PATH",
        help=f"a {LAYOUT_FILE} (or a store directory) whose layout a new store gets (default: "
        "the archive's file size and the store's defaults)",
    )
    r.set_defaults(func=cmd_archive_restore)
