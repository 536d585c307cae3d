"""Running the official RocketMQ clients' programs (tests/interop/python, tests/interop/node)
from pytest: each in its own environment and process (``make interop-deps`` builds them), with a
deadline, its JSON lines parsed as it prints them, and its stderr (and the client's own log
file) in the failure when it fails or overruns.

A program takes its plan as JSON on argv; one that stays (a push consumer, a producer answering
transaction checks) runs until its stdin is closed (``Program.stop``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ROCKETMQ_PYTHON = ROOT / ".venv-rocketmq" / "bin" / "python"
NODE_DIR = ROOT / "tests" / "interop" / "node"
PROGRAM_TIMEOUT_S = 60.0

Event = dict[str, Any]


@dataclass(frozen=True)
class OfficialClient:
    """One official client: how to run its program ``name`` (producer, simple_consumer,
    push_consumer), and where it keeps its log under the HOME we give it."""

    name: str
    version: str
    log_glob: str

    def command(self, program: str, plan: dict[str, Any]) -> list[str]:
        text = json.dumps(plan)
        if self.name == "python":
            if not ROCKETMQ_PYTHON.exists():
                raise AssertionError(f"{ROCKETMQ_PYTHON} is missing: run `make interop-deps`")
            return [str(ROCKETMQ_PYTHON), "-m", f"tests.interop.python.{program}", text]
        if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").exists():
            raise AssertionError(f"{NODE_DIR}/node_modules is missing: run `make interop-deps`")
        return ["node", str(NODE_DIR / f"{program}.js"), text]

    def script_command(self, script: Path, *args: str) -> tuple[list[str], dict[str, str]]:
        """How a user's script (the docs' examples) runs with this client, and its environment
        additions (Node finds the client through NODE_PATH)."""
        if self.name == "python":
            return [str(ROCKETMQ_PYTHON), str(script), *args], {}
        return ["node", str(script), *args], {"NODE_PATH": str(NODE_DIR / "node_modules")}


PYTHON = OfficialClient("python", "rocketmq-python-client 5.1.2", "logs/rocketmq_python/*.log")
NODE = OfficialClient("node", "rocketmq-client-nodejs 1.0.8", "logs/rocketmq/*.log")


class Program:
    """A running client program: its events so far (a reader thread parses stdout), and its
    stderr in a file."""

    def __init__(
        self,
        client: OfficialClient,
        program: str,
        command: list[str],
        home: Path,
        env: dict[str, str] | None = None,
    ):
        self.client, self.program, self.home = client, program, home
        home.mkdir(parents=True, exist_ok=True)
        self.stderr_path = home / f"{program}.stderr"
        self.events: list[Event] = []
        self.noise: list[str] = []
        self._lock = threading.Lock()
        # Its own HOME: the clients log to ~/logs, which we show on failure.
        environ = {**os.environ, "HOME": str(home), **(env or {})}
        environ.pop("PYTHONPATH", None)
        with self.stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=environ,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for raw in self.proc.stdout:
                self._take(raw)

    def _take(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").strip()
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        with self._lock:
            if isinstance(event, dict) and "event" in event:
                self.events.append(event)
            elif line:
                self.noise.append(line)

    def of(self, kind: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    def diagnostics(self) -> str:
        """What the program printed and logged: stdout, stderr and the client's log files."""
        parts = [f"{self.client.name} {self.program} (exit {self.proc.poll()})"]
        with self._lock:
            parts += ["--- events ---", *map(json.dumps, self.events), *self.noise]
        parts += ["--- stderr ---", self.stderr_path.read_text(errors="replace")[-20_000:]]
        for log in sorted(self.home.glob(self.client.log_glob)):
            parts += [f"--- {log.name} ---", log.read_text(errors="replace")[-20_000:]]
        return "\n".join(parts)

    def wait_for(self, what: str, predicate: Callable[[Program], bool], timeout_s: float) -> None:
        """Until ``predicate(self)`` holds; fails with the diagnostics if the program exits
        first or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            if self.proc.poll() is not None:
                self._reader.join(5)
                if predicate(self):
                    return
                raise AssertionError(f"exited before {what}:\n{self.diagnostics()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout_s}s:\n{self.diagnostics()}")
            time.sleep(0.02)

    def lines(self) -> list[str]:
        """What it printed that is not one of our JSON events (a user's script's output)."""
        with self._lock:
            return list(self.noise)

    def tell(self, line: str) -> None:
        """One line on its stdin (a program that stays reads commands there)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout_s: float = PROGRAM_TIMEOUT_S, done: bool = True) -> list[Event]:
        """Closes its stdin (a program that stays then shuts its client down), waits for it to
        end with exit 0 (and ``done`` if asked), and returns every event."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it had ended; its exit code says how
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"still running after {timeout_s}s:\n{self.diagnostics()}"
            ) from None
        self._reader.join(5)
        if code != 0 or (done and not self.of("done")):
            raise AssertionError(f"failed:\n{self.diagnostics()}")
        with self._lock:
            return list(self.events)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(5)
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()


class Programs:
    """Starts programs for one test, each with its own HOME under ``tmp``; kills what is still
    running at the end (``close``), and prints the diagnostics of every program when asked."""

    def __init__(self, client: OfficialClient, tmp: Path) -> None:
        self.client, self.tmp = client, tmp
        self.started: list[Program] = []

    def start(
        self, program: str, plan: dict[str, Any], env: dict[str, str] | None = None
    ) -> Program:
        command = self.client.command(program, plan)
        home = self.tmp / f"{program}-{len(self.started)}"
        p = Program(self.client, program, command, home, env)
        self.started.append(p)
        return p

    def run_script(
        self, script: Path, *args: str, timeout_s: float = PROGRAM_TIMEOUT_S
    ) -> list[str]:
        """Runs a user's script with this client to its end (exit 0); returns its stdout lines."""
        command, env = self.client.script_command(script, *args)
        p = Program(
            self.client, script.name, command, self.tmp / f"script-{len(self.started)}", env
        )
        self.started.append(p)
        p.wait_for("its end", lambda p: p.proc.poll() is not None, timeout_s)
        p.finish(timeout_s, done=False)
        return p.lines()

    def run(
        self,
        program: str,
        plan: dict[str, Any],
        timeout_s: float = PROGRAM_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> list[Event]:
        """Runs a program that ends by itself, and returns its events."""
        p = self.start(program, plan, env)
        p.wait_for("its end", lambda p: p.proc.poll() is not None, timeout_s)
        return p.finish(timeout_s)

    def close(self) -> None:
        for p in self.started:
            p.kill()


def run_python_docs_example(endpoint: str, tmp: Path) -> None:
    """docs/examples/official_python_client.py, run unmodified against ``endpoint``: it sends
    one message tagged ``created`` and must receive that very message."""
    programs = Programs(PYTHON, tmp)
    try:
        lines = programs.run_script(
            ROOT / "docs" / "examples" / "official_python_client.py", endpoint
        )
    finally:
        programs.close()
    sent = [line.split()[1] for line in lines if line.startswith("sent ")]
    received = [line.split() for line in lines if line.startswith("received ")]
    assert len(sent) == 1 and len(received) == 1, lines
    assert received[0][1:3] == [sent[0], "created"]
