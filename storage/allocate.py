"""Creating the store's fixed-size files (CommitLog and ConsumeQueue files, index files, the
checkpoint): one function, so a full disk fails the same way wherever the store makes a file.

Files are reserved with ``posix_fallocate`` rather than left sparse: on a full disk the failure is
an error at file creation, not a SIGBUS on some later page write that kills the process. ENOSPC
is ``DiskFullError`` (retriable: retention may free space); any other failure to reserve the
blocks is ``StoreNotWritableError``, its parent.
"""

from __future__ import annotations

import errno
import os

from tidemq.storage.errors import DiskFullError, StoreNotWritableError


def allocate(path: str, size: int) -> None:
    """Create ``path`` at exactly ``size`` bytes with its blocks reserved, or fail cleanly (no
    file left behind)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        if e.errno == errno.ENOSPC:
            raise DiskFullError(f"no space for {path} ({size} bytes)") from e
        raise StoreNotWritableError(f"cannot allocate {size} bytes for {path}: {e}") from e
    os.close(fd)
