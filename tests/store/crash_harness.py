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


class WriterOutput:
    """What the tests read of a writer, however it was started: its stdout line by line, its
    stderr file."""

    reader: LineReader
    err_path: Path

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def _wait(self, timeout_s: float) -> int:
        """Its exit code (negative: the signal that ended it), waiting up to ``timeout_s``."""
        raise NotImplementedError

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # it may have killed itself
            os.killpg(self.pid, signal.SIGKILL)

    def _release(self) -> None:
        self.reader.close()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def readline(self, timeout_s: float = 30.0) -> str:
        line = self.reader.readline(timeout_s)
        if line is None:
            rc = self._wait(30)
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
        self._kill_group()
        rc = self._wait(timeout_s)
        assert rc == -signal.SIGKILL, f"writer exited with {rc}, not by SIGKILL:\n{self.stderr()}"
        rest = list(self.reader.lines(timeout_s))
        self.close()
        return rest

    def finish(self, timeout_s: float = 60.0) -> int:
        rc = self._wait(timeout_s)
        self.close()
        return rc

    def close(self) -> None:
        raise NotImplementedError


class Writer(WriterOutput):
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
        return super().stderr()

    def _wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.reader.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._err.close()


class ForkServer:
    """crash_writer.py --serve: one interpreter with the store imported, forking a writer per
    ``spawn``. A writer then costs a fork instead of a Python start-up and its imports, which
    is most of a kill cycle; the writer itself runs the same code in its own session."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.spawned = 0
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=str(REPO),
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.commands = self.proc.stdin
        self.replies = LineReader(self.proc.stdout)
        self.current: ForkedWriter | None = None

    def reply(self, timeout_s: float) -> list[str]:
        line = self.replies.readline(timeout_s)
        if line is None:
            raise AssertionError(f"the fork server exited ({self.proc.wait(30)})")
        return line.split()

    def spawn(self, store_dir: str | Path, *args: str, err_path: str | Path) -> ForkedWriter:
        assert self.current is None, "one writer at a time"
        self.spawned += 1
        fifo = self.work_dir / f"writer-{self.spawned}.out"
        os.mkfifo(fifo)
        # Non-blocking, so the open needs no writer yet; the server opens the writing end
        # before it forks and answers.
        out_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        argv = [str(fifo), str(err_path), str(store_dir), *args]
        assert not any(" " in a or "\n" in a for a in argv), argv
        self.commands.write((" ".join(argv) + "\n").encode())
        self.commands.flush()
        tag, pid = self.reply(30)
        assert tag == "P", (tag, pid)
        self.current = ForkedWriter(self, int(pid), os.fdopen(out_fd, "rb"), Path(err_path))
        return self.current

    def reap(self, pid: int, timeout_s: float) -> int:
        tag, reaped, status = self.reply(timeout_s)
        assert (tag, int(reaped)) == ("X", pid), (tag, reaped, status)
        self.current = None
        return os.waitstatus_to_exitcode(int(status))

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
        self.commands.close()  # the server's loop ends at end of input
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self.replies.close()
            assert self.proc.stdout is not None
            self.proc.stdout.close()


class ForkedWriter(WriterOutput):
    """A writer the fork server started; the server reaps it and reports how it ended."""

    def __init__(self, server: ForkServer, pid: int, out: IO[bytes], err_path: Path) -> None:
        self.server = server
        self._pid = pid
        self._out = out
        self.reader = LineReader(out)
        self.err_path = err_path
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def _wait(self, timeout_s: float) -> int:
        if self.returncode is None:
            self.returncode = self.server.reap(self._pid, timeout_s)
        return self.returncode

    def close(self) -> None:
        if self.returncode is None:
            self._kill_group()
            self._wait(30)
        self.reader.close()
        self._out.close()


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
