"""The parent's side of the crash tests' child processes: crash_writer.py in its own session, its
stdout read line by line against deadlines, SIGKILLed as a group; and the store CLI run as a user
would."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().with_name("crash_writer.py")


class LineReader:
    """Whole lines from a pipe, each read bounded by a deadline (never a blind sleep)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.fd = pipe.fileno()
        self.buf = b""
        self.eof = False
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)

    def readline(self, timeout_s: float) -> str | None:
        """The next whole line, None at end of file; TimeoutError past the deadline."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from the writer within {timeout_s} s")
            if self.sel.select(left):
                chunk = os.read(self.fd, 1 << 16)
                if chunk:
                    self.buf += chunk
                else:
                    self.eof = True
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def lines(self, timeout_s: float) -> Iterator[str]:
        """Every remaining whole line until end of file (a torn last line is dropped)."""
        while (line := self.readline(timeout_s)) is not None:
            yield line

    def close(self) -> None:
        self.sel.close()


@dataclass
class Recovered:
    abnormal: bool
    cut_bytes: int
    end_offset: int
    pid: int


class Writer:
    """crash_writer.py in its own session, so SIGKILL of its group leaves nothing behind."""

    def __init__(self, store_dir: str | Path, *args: str, err_path: str | Path) -> None:
        self.err_path = Path(err_path)
        self._err = open(self.err_path, "wb")  # noqa: SIM115 - closed in kill()/finish()
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(store_dir), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=str(REPO),
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.reader = LineReader(self.proc.stdout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def readline(self, timeout_s: float = 30.0) -> str:
        line = self.reader.readline(timeout_s)
        if line is None:
            rc = self.proc.wait(30)
            raise AssertionError(f"writer exited ({rc}) early; stderr:\n{self.stderr()}")
        return line

    def recovered(self) -> Recovered:
        line = self.readline()
        f = line.split()
        assert f[0] == "R", f"expected the recovery line, got {line!r}; stderr:\n{self.stderr()}"
        return Recovered(f[1] == "1", int(f[2]), int(f[3]), int(f[4]))

    def kill(self, timeout_s: float = 30.0) -> list[str]:
        """SIGKILL the writer's process group; returns the whole lines it printed before dying
        that were not read yet (they were acknowledged too)."""
        with contextlib.suppress(ProcessLookupError):  # it may have killed itself
            os.killpg(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait(timeout_s)
        assert rc == -signal.SIGKILL, f"writer exited with {rc}, not by SIGKILL:\n{self.stderr()}"
        rest = list(self.reader.lines(timeout_s))
        self.close()
        return rest

    def finish(self, timeout_s: float = 60.0) -> int:
        rc = self.proc.wait(timeout_s)
        self.close()
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.reader.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._err.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
        check=False,
    )
