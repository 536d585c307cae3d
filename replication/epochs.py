"""Epochs of a CommitLog: which master epoch wrote which range, and where two logs part.

Every election raises the broker group's epoch (kept in ZooKeeper). A master appends
``(epoch, its max offset)`` when it takes over; a slave appends the pair a chunk carries when
the epoch changes. Two logs that share an epoch with the same start offset hold the same bytes
for as far as both went in it; past that they may differ (an old master's unreplicated tail).
``consistent_point`` finds where to cut a returning broker back to (RocketMQ 5's
``EpochFileCache.findConsistentPoint``, spec §5.4).

File format (``epochs`` in the store root), text, written whole each time::

    <number of entries>\\n
    <CRC-32 (zlib.crc32) of the entry lines, decimal>\\n
    <epoch>-<start offset>\\n          one line per entry, oldest first

Written like every small store file (``tidemq.storage.atomic_file``: a temporary file, fsynced,
renamed into place, the previous version kept as ``epochs.bak``), so a crash leaves one whole
list; a reader falls back to the backup when the main file is missing, torn or fails its CRC.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidemq.storage.atomic_file import write_atomic
from tidemq.storage.state_file import StateFileError

FILE_NAME = "epochs"
BACKUP_SUFFIX = ".bak"


class EpochFileError(StateFileError):
    """An epoch list that is not whole (``decode``), or neither the epoch file nor its backup
    holds one (``EpochFile``: the message names the file and the fix)."""

    def __init__(self, problem: str, path: str = FILE_NAME, fix: str = "") -> None:
        super().__init__(path, problem, fix)


def fix_hint(root: str | Path) -> str:
    return (
        f"`tidemq broker repair-state --store {root} --reset epochs` keeps the bad file as "
        f"{FILE_NAME}.corrupt-<time> and starts an empty list; the broker then rejoins its group "
        f"by comparing records with the master's instead of epochs, and ranks last among "
        f"in-sync candidates in an election until it has replicated under the current epoch"
    )


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class EpochLog:
    """Entries in order of strictly rising epoch and non-decreasing start offset."""

    def __init__(self, entries: Iterable[EpochEntry] = ()) -> None:
        self.entries: list[EpochEntry] = []
        for e in entries:
            self.append(e.epoch, e.start_offset)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        """A newer epoch starts at ``start_offset``. An epoch that wrote nothing (the next one
        starts where it did) is replaced: it holds no byte either log could disagree on."""
        if epoch <= 0 or start_offset < 0:
            raise ValueError(f"bad epoch entry {epoch}-{start_offset}")
        if self.entries:
            last = self.entries[-1]
            if epoch <= last.epoch:
                raise ValueError(f"epoch {epoch} is not after the last one, {last.epoch}")
            if start_offset < last.start_offset:
                raise ValueError(
                    f"epoch {epoch} starts at {start_offset}, before epoch {last.epoch} "
                    f"({last.start_offset})"
                )
            if start_offset == last.start_offset:
                self.entries.pop()
        self.entries.append(EpochEntry(epoch, start_offset))

    def epoch_at(self, offset: int) -> EpochEntry | None:
        """The entry whose range holds ``offset`` (the last one starting at or before it)."""
        found = None
        for e in self.entries:
            if e.start_offset > offset:
                break
            found = e
        return found

    def next_start_after(self, epoch: int) -> int | None:
        """Where the epoch after ``epoch`` starts; None when ``epoch`` is the last."""
        for e in self.entries:
            if e.epoch > epoch:
                return e.start_offset
        return None

    def truncate_from(self, offset: int) -> None:
        """The log was cut back to ``offset``: epochs starting at or past it wrote nothing that
        is left."""
        self.entries = [e for e in self.entries if e.start_offset < offset]

    def truncate_before(self, min_offset: int) -> None:
        """Retention deleted everything below ``min_offset``: drop epochs wholly below it."""
        keep = [
            e
            for i, e in enumerate(self.entries)
            if i + 1 == len(self.entries) or self.entries[i + 1].start_offset > min_offset
        ]
        self.entries = keep


def _ends(entries: Sequence[EpochEntry], max_offset: int) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for i, e in enumerate(entries):
        end = entries[i + 1].start_offset if i + 1 < len(entries) else max_offset
        out[e.epoch] = (e.start_offset, end)
    return out


def consistent_point(
    local: Sequence[EpochEntry],
    local_max: int,
    remote: Sequence[EpochEntry],
    remote_max: int,
) -> int | None:
    """The offset up to which ``local`` and ``remote`` hold the same bytes, or None when they
    share no epoch. From the newest local epoch back, the first epoch both have with the same
    start: the point is the lower of its two ends."""
    theirs = _ends(remote, remote_max)
    for epoch, (start, end) in sorted(_ends(local, local_max).items(), reverse=True):
        other = theirs.get(epoch)
        if other is not None and other[0] == start:
            return min(end, other[1])
    return None


def encode(entries: Sequence[EpochEntry]) -> bytes:
    body = "".join(f"{e.epoch}-{e.start_offset}\n" for e in entries).encode("ascii")
    return f"{len(entries)}\n{zlib.crc32(body)}\n".encode("ascii") + body


def decode(data: bytes) -> list[EpochEntry]:
    """Raises EpochFileError on anything but a whole, CRC-checked list."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise EpochFileError("not ASCII") from None
    head, _, rest = text.partition("\n")
    crc_text, _, body = rest.partition("\n")
    try:
        count, crc = int(head), int(crc_text)
    except ValueError:
        raise EpochFileError("bad header") from None
    if zlib.crc32(body.encode("ascii")) != crc:
        raise EpochFileError("CRC mismatch (torn write?)")
    lines = body.splitlines()
    if len(lines) != count or (body and not body.endswith("\n")):
        raise EpochFileError(f"{len(lines)} entries, header says {count}")
    entries = []
    for line in lines:
        epoch, sep, start = line.partition("-")
        if not sep or not epoch.isdigit() or not start.isdigit():
            raise EpochFileError(f"bad entry {line!r}")
        entries.append(EpochEntry(int(epoch), int(start)))
    try:
        EpochLog(entries)
    except ValueError as e:
        raise EpochFileError(str(e)) from None
    return entries


class EpochFile:
    """An EpochLog kept in ``<store root>/epochs``; every change is written through."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / FILE_NAME
        self.backup = self.path.with_name(FILE_NAME + BACKUP_SUFFIX)
        self.log = EpochLog(self._load())

    def _load(self) -> list[EpochEntry]:
        problems = []
        for path in (self.path, self.backup):
            try:
                return decode(path.read_bytes())
            except FileNotFoundError:
                problems.append("")
            except EpochFileError as e:
                problems.append(e.problem)
        main, backup = problems
        if main or backup:
            raise EpochFileError(
                f"{main or 'missing'} (its backup {self.backup.name}: {backup or 'missing'})",
                str(self.path),
                fix_hint(self.path.parent),
            )
        return []  # a store that never served under an epoch

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self.log.entries)

    @property
    def last_epoch(self) -> int:
        return self.log.last_epoch

    def append(self, epoch: int, start_offset: int) -> None:
        self.log.append(epoch, start_offset)
        self._write()

    def truncate_from(self, offset: int) -> None:
        before = self.log.entries
        self.log.truncate_from(offset)
        if self.log.entries != before:
            self._write()

    def truncate_before(self, min_offset: int) -> None:
        before = self.log.entries
        self.log.truncate_before(min_offset)
        if self.log.entries != before:
            self._write()

    def _write(self) -> None:
        write_atomic(str(self.path), encode(self.log.entries))
