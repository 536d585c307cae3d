"""Disks that fail: the ``diskfault`` shim and the file that arms it (EIO on command, for one
process), and a small tmpfs that really fills up (ENOSPC, root only).

``DiskFault(control_path)`` gives the environment a child runs with (``env``, or ``below``,
which puts it in this process's environment for the children started in the block), and arms or
clears faults while the child runs: ``arm("fdatasync", "EIO", "/store/commitlog")`` makes the
child's next fdatasync on any file whose path contains that part fail with EIO
(``tests/faults/diskfault.c`` says which calls can fail).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import preload_env

CONTROL_ENV = "TIDEMQ_DISKFAULT_CONTROL"


class DiskFault:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.rules: list[tuple[str, str, str]] = []

    @property
    def env(self) -> dict[str, str]:
        return preload_env("diskfault", **{CONTROL_ENV: str(self.control)})

    @contextlib.contextmanager
    def below(self) -> Iterator[None]:
        """Children started in the block run with the shim (this process does not: a preload
        acts at exec only)."""
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", CONTROL_ENV)}
        env = self.env
        os.environ.update({k: env[k] for k in saved})
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def arm(self, call: str, errno_name: str, path_part: str | os.PathLike[str]) -> None:
        self.rules.append((call, errno_name, str(path_part)))
        self._write()

    def clear(self) -> None:
        self.rules = []
        self._write()

    def _write(self) -> None:
        # Renamed into place: the shim reads whole files only.
        tmp = self.control.with_name(self.control.name + ".tmp")
        tmp.write_text("".join(f"{c} {e} {p}\n" for c, e, p in self.rules))
        os.replace(tmp, self.control)


def need_root() -> None:
    """Skip the calling test unless it may mount file systems."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that really fills up) needs root")


@contextlib.contextmanager
def small_disk(directory: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``directory``: writes past it fail with ENOSPC."""
    need_root()
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)], check=True
    )
    try:
        yield directory
    finally:
        # Lazy: a process the test killed may still hold a file open there for a moment.
        subprocess.run(["umount", "-l", str(directory)], check=True)


def fill(directory: Path) -> Path:
    """Fill the file system holding ``directory`` to the last block; returns the filler file
    (delete it and the space is back)."""
    filler = directory / "filler"
    chunk = bytes(64 << 10)
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    # The last partial chunk: byte by byte is too slow, halve until nothing fits.
    size = len(chunk) // 2
    with filler.open("ab", buffering=0) as f:
        while size:
            try:
                f.write(bytes(size))
            except OSError:
                size //= 2
    return filler
