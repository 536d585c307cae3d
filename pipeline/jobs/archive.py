"""An archive (docs/archive.md) as input of the jobs: its archived CommitLog files, read directly
from the directory or bucket, without a broker.

The driver lists the archive's manifest (``list_archive``); each Spark task then opens the
backend itself and fetches one whole file (``ArchivedFile.fetch``): every chunk's MD5 and the
file's SHA-256 are checked against its manifest entry before a byte of it is parsed. Decompressed,
an archived file is the CommitLog file byte for byte, so the jobs walk it as a local one.

The only module of the pipeline that imports the archive's code (pyproject.toml's ``pipeline``
import contract names these imports).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from tidemq.storage.archive.backends import ArchiveBackend, open_backend
from tidemq.storage.archive.format import ArchiveError, ManifestEntry
from tidemq.storage.archive.reader import ArchiveReader
from tidemq.storage.archive.segments import fetch_segment

# Listing reads manifest entries only; nothing is cached.
_LIST_CACHE_BYTES = 1 << 20


class ArchiveInputError(ValueError):
    """An archive the job cannot use: a URI that names none, an archive that cannot be reached
    or listed, or an archived object that fails its checks (never read)."""


@dataclass(frozen=True)
class ArchiveLocation:
    """Where an archive is: ``uri`` as ``backends.open_backend`` takes it (a directory path,
    ``file:///PATH`` or ``s3://BUCKET/PREFIX``), and the endpoint of an S3-compatible store
    other than AWS (None: ``AWS_ENDPOINT_URL`` or AWS). Credentials come from boto3's usual
    places in each process (the executors' environment, an instance role)."""

    uri: str
    s3_endpoint: str | None = None

    def backend(self) -> ArchiveBackend:
        try:
            return open_backend(self.uri, self.s3_endpoint or None)
        except ArchiveError as e:
            raise ArchiveInputError(str(e)) from None


@dataclass(frozen=True)
class ArchivedFile:
    """One archived CommitLog file: its archive and its manifest entry (pickled into the Spark
    partition, so a task fetches it without listing the archive again)."""

    location: ArchiveLocation
    archive_uri: str  # the backend's own spelling (file:///abs/path, s3://bucket/prefix/)
    entry: ManifestEntry

    @property
    def path(self) -> str:
        """How rows and reports name the file: the key prefix of its chunks."""
        return f"{self.archive_uri.rstrip('/')}/segments/{self.entry.name}"

    def fetch(self) -> bytes:
        """The whole file, every chunk and the file's SHA-256 checked; raises
        ``ArchiveInputError`` naming the object that fails (and then nothing of the file is
        returned), or when the archive cannot be read."""
        try:
            return fetch_segment(self.location.backend(), self.entry)
        except ArchiveError as e:
            raise ArchiveInputError(
                f"{_naming(self.archive_uri, e)}; no record of CommitLog file {self.entry.name} "
                "is read from it"
            ) from e


def _naming(uri: str, e: ArchiveError) -> str:
    """The archive's error, saying which archive (a backend's own errors do already)."""
    text = str(e)
    return text if text.startswith(f"archive {uri}") else f"archive {uri}: {text}"


def is_archive_uri(text: str) -> bool:
    """``s3://...`` or ``file://...``: an archive whatever the path holds."""
    return urlparse(text).scheme in ("s3", "file")


@dataclass(frozen=True)
class ArchiveListing:
    uri: str  # as its backend spells it
    files: list[ArchivedFile]  # by base offset
    # The names of the files its manifest records as not archived (no topic in them wanted
    # archiving: nothing of them was uploaded).
    not_archived: list[str]


def list_archive(location: ArchiveLocation) -> ArchiveListing:
    """What the archive's manifest lists."""
    backend = location.backend()
    reader = ArchiveReader(backend, cache_bytes=_LIST_CACHE_BYTES, record_crc=True)
    try:
        reader.refresh()
    except ArchiveError as e:
        raise ArchiveInputError(f"cannot list the manifest: {_naming(backend.uri, e)}") from e
    files: list[ArchivedFile] = []
    skipped: list[str] = []
    for entry in reader.entries():
        if entry.archived:
            files.append(ArchivedFile(location, backend.uri, entry))
        else:
            skipped.append(entry.name)
    return ArchiveListing(backend.uri, files, skipped)


def locations(uris: Sequence[str], s3_endpoint: str | None) -> list[ArchiveLocation]:
    return [ArchiveLocation(u, s3_endpoint or None) for u in uris]
