"""A failing disk for one process: the ``diskfault`` shim and the file that arms it.

``DiskFault(control_path)`` gives the environment a child runs with (``env``, or ``below``,
which puts it in this process's environment for the children started in the block), and arms or
clears faults while the child runs: ``arm("fdatasync", "EIO", "/store/commitlog")`` makes the
child's next fdatasync on any file whose path contains that part fail with EIO
(``tests/faults/diskfault.c`` says which calls can fail).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

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
