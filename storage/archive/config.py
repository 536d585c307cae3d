"""Archive settings (docs/archive.md), validated once; part of ``StoreConfig`` (``archive``)."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.storage.errors import ConfigError

POLICIES = ("archive", "delete")
COMPRESSIONS = ("zstd", "none")


@dataclass(frozen=True)
class ArchiveConfig:
    # Where: a directory path, file:///PATH, or s3://BUCKET/PREFIX (``backends.open_backend``).
    uri: str
    # The retention policy of topics that set none: ``archive`` (a file holding any of their
    # records is archived before retention deletes it) or ``delete``.
    default_policy: str = "archive"
    compression: str = "zstd"
    # Level 1: on this project's benchmark as small as level 3 on CommitLog data, and about
    # 1.6x faster to archive and 1.4x faster to read back (docs/archive.md, "Measured").
    zstd_level: int = 1
    # Archived files are cut into chunks this size, compressed each on its own: the unit of a
    # resumed upload and of a read past retention.
    chunk_bytes: int = 8 << 20
    # Decompressed chunks (and queue slices) kept for reads past retention.
    cache_bytes: int = 256 << 20
    # How often the master looks for sealed CommitLog files to archive.
    interval_ms: int = 5_000
    # An S3-compatible endpoint other than AWS's (MinIO, Ceph); empty: AWS_ENDPOINT_URL or AWS.
    s3_endpoint_url: str = ""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.uri:
            problems.append("uri is empty")
        if self.default_policy not in POLICIES:
            problems.append(
                f"default_policy must be one of {POLICIES}, got {self.default_policy!r}"
            )
        if self.compression not in COMPRESSIONS:
            problems.append(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        if not 1 <= self.zstd_level <= 22:
            problems.append("zstd_level must be 1-22")
        if self.chunk_bytes < 4096:
            problems.append("chunk_bytes must be >= 4096")
        if self.cache_bytes < self.chunk_bytes:
            problems.append("cache_bytes must be >= chunk_bytes")
        if self.interval_ms <= 0:
            problems.append("interval_ms must be > 0")
        if problems:
            raise ConfigError("invalid archive config: " + "; ".join(problems))
