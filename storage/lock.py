"""The store directory lock: one process per store.

An exclusive ``flock`` on ``{root}/lock`` (released by the kernel when the holder dies, even by
SIGKILL, so a crash never leaves a stale lock). The holder's PID is written into the file so the
refusal can name it.
"""

from __future__ import annotations

import fcntl
import os

from tidemq.storage.errors import StoreLockedError


class StoreLock:
    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(root_dir, "lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"store {os.path.dirname(self.path)} is in use by another process (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def fileno(self) -> int | None:
        """The locked descriptor; a process that inherits it holds the lock until it exits."""
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
