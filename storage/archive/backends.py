"""Where an archive's objects live: a directory (a mounted volume, NFS, a PVC) or an S3-compatible
object store. Both offer the same few calls, on whole objects named by ``/``-separated keys.

An archive is named by a URI: ``file:///mnt/archive`` or a plain path for a directory,
``s3://bucket/prefix`` for a bucket. S3 credentials and region come from boto3's usual places
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_SHARED_CREDENTIALS_FILE``, an instance
role); the endpoint of a store other than AWS (MinIO, Ceph, a test server) from ``endpoint_url``
or ``AWS_ENDPOINT_URL``.

Every failure to reach the store or to complete a request is an ``ArchiveUnavailableError``
(retriable): the archiver tries again at its next pass, and retention deletes nothing meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

from tidemq.storage.archive.format import ArchiveError, ArchiveUnavailableError

T = TypeVar("T")


class ArchiveBackend(Protocol):
    uri: str

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` whole, replacing what was there; the object is either
        the old one or all of ``data``, never part of it."""

    def get(self, key: str) -> bytes | None:
        """The object, or None when there is none."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object that exists."""

    def md5(self, key: str) -> str | None:
        """The MD5 (hex) of the object's bytes, or None when there is none."""

    def list(self, prefix: str) -> Iterator[str]:
        """Keys under ``prefix``, in key order."""


class DirectoryBackend:
    """Objects as files under ``root``; a put writes a temporary file beside the target, syncs
    it and renames it into place, so a crash leaves the old object or the new one."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts):
            raise ArchiveError(f"bad archive key {key!r}")
        return os.path.join(self.root, *parts)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".put-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dfd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise ArchiveUnavailableError(f"archive {self.uri}: cannot write {key}: {e}") from e

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ArchiveUnavailableError(f"archive {self.uri}: cannot read {key}: {e}") from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except OSError as e:
            raise ArchiveUnavailableError(f"archive {self.uri}: cannot read {key}: {e}") from e

    def md5(self, key: str) -> str | None:
        data = self.get(key)
        return None if data is None else hashlib.md5(data, usedforsecurity=False).hexdigest()

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not os.path.isdir(self.root):
            raise ArchiveUnavailableError(f"archive {self.uri}: directory missing")
        out: list[str] = []
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)
            for name in files:
                if name.startswith(".put-"):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    out.append(key)
        yield from sorted(out)


class S3Backend:
    """Objects in ``bucket`` under ``prefix``. A put sends the body's MD5 (Content-MD5), so the
    store refuses a body damaged on the way; single-part puts make the ETag that MD5, which is
    how ``md5`` answers without downloading."""

    def __init__(
        self, bucket: str, prefix: str, endpoint_url: str | None = None, region: str | None = None
    ) -> None:
        # boto3 takes about 0.3 s to import: only a broker with an S3 archive pays it.
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=region or os.environ.get("AWS_REGION") or "us-east-1",
            # botocore's own retries (standard mode) cover throttling and dropped connections
            # within a call; what fails beyond them is retried at the next archiver pass.
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
            ),
        )

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Run one S3 request; an unreachable endpoint, refused credentials or a missing bucket
        become ``ArchiveUnavailableError``."""
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            return fn()
        except (BotoCoreError, ClientError, OSError) as e:
            raise ArchiveUnavailableError(f"archive {self.uri}: cannot {what} {key}: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        self._call(
            "write",
            key,
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=self.prefix + key, Body=data, ContentMD5=md5
            ),
        )

    def get(self, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                obj = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            except self._client.exceptions.NoSuchKey:
                return None
            data: bytes = obj["Body"].read()
            return data

        return self._call("read", key, read)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        def read() -> bytes:
            obj = self._client.get_object(
                Bucket=self.bucket, Key=self.prefix + key, Range=f"bytes={start}-{end - 1}"
            )
            data: bytes = obj["Body"].read()
            return data

        return self._call("read", key, read)

    def md5(self, key: str) -> str | None:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        def head() -> dict[str, Any] | None:
            try:
                out: dict[str, Any] = self._client.head_object(
                    Bucket=self.bucket, Key=self.prefix + key
                )
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
            return out

        found = self._call("stat", key, head)
        if found is None:
            return None
        etag = str(found.get("ETag", "")).strip('"')
        if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
            return etag
        # A multipart or encrypted object's ETag is no MD5: read it and compute one.
        data = self.get(key)
        return None if data is None else hashlib.md5(data, usedforsecurity=False).hexdigest()

    def list(self, prefix: str) -> Iterator[str]:
        def keys() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            n = len(self.prefix)
            return [o["Key"][n:] for page in pages for o in page.get("Contents", [])]

        yield from sorted(self._call("list", prefix, keys))


def open_backend(uri: str, endpoint_url: str | None = None) -> ArchiveBackend:
    """The backend a URI names (the module docstring lists the forms)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ArchiveError(f"archive URI {uri!r} names no bucket (s3://BUCKET/PREFIX)")
        return S3Backend(parsed.netloc, parsed.path, endpoint_url)
    if parsed.scheme == "file":
        if not parsed.path:
            raise ArchiveError(f"archive URI {uri!r} names no directory")
        return DirectoryBackend(parsed.path)
    if parsed.scheme == "" and uri:
        return DirectoryBackend(uri)
    raise ArchiveError(f"archive URI {uri!r}: use a path, file:///PATH or s3://BUCKET/PREFIX")
