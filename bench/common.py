"""Helpers shared by the benchmark scripts of this directory (not run directly).

The scripts run as ``python bench/<name>.py``, so this directory is first on ``sys.path`` and
they import this module as ``common``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIDEMQ = [sys.executable, "-m", "tidemq.cli"]
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60.0


def emit(obj: dict[str, Any]) -> None:
    obj.setdefault("load1", round(os.getloadavg()[0], 2))
    print(json.dumps(obj), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """A child process run from the repo root, its stdout and stderr in a log file."""

    def __init__(self, name: str, cmd: Sequence[str], log: str) -> None:
        self.name, self.log = name, log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def output(self) -> str:
        with open(self.log) as f:
            return f.read()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Signal it and wait; SIGKILL if it is still there after ``timeout_s`` or if the wait
        is interrupted (a second Ctrl-C)."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise


def stop_all(procs: Sequence[Process]) -> None:
    """Stop ``procs`` in this order; when one stop fails, the rest are killed before it raises."""
    for i, proc in enumerate(procs):
        try:
            proc.stop()
        except BaseException:
            for rest in procs[i + 1 :]:
                rest.proc.kill()
                rest.proc.wait()
            raise


def failure(what: str, procs: Sequence[Process]) -> RuntimeError:
    """An error naming what failed, with the log tails of ``procs`` (only the dead ones if any)."""
    dead = [p for p in procs if not p.alive()]
    logs = "".join(f"\n--- {p.name}:\n{p.output()[-4000:]}" for p in dead or procs)
    exited = "".join(f"; {p.name} exited with {p.proc.returncode}" for p in dead)
    return RuntimeError(f"{what}{exited}{logs}")


def wait_until(
    done: Callable[[], bool],
    what: str,
    procs: Sequence[Process] = (),
    timeout_s: float = START_TIMEOUT_S,
    interval_s: float = 0.1,
) -> None:
    """Poll ``done`` until true; fail when it takes too long or one of ``procs`` exits."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if not all(p.alive() for p in procs):
            raise failure(what, procs)
        if time.monotonic() > deadline:
            raise failure(f"{what}: not within {timeout_s:.0f} s", procs)
        time.sleep(interval_s)


def tidemq_bench(nameserver: str, *args: str) -> dict[str, Any]:
    """``tidemq bench <args> --json`` against the cluster of ``nameserver``: its JSON result."""
    out = subprocess.run(
        [*TIDEMQ, "bench", *args, "--json", "--nameserver", nameserver],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench {' '.join(args)} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def perfkit_grpc(perfkit: str, cases: Sequence[str]) -> dict[str, dict[str, Any]]:
    """perfkit's ``grpc_bench.py`` on an aio server, one run of 4 s: each case's median line."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "grpc_bench.py",
            "--runs",
            "1",
            "--secs",
            "4",
            "--servers",
            "aio",
            "--cases",
            ",".join(cases),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=perfkit,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        # Its server child too: the whole process group (the child is not reaped yet).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"perfkit grpc_bench.py failed:\n{stderr[-4000:]}")
    found = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            if r.get("bench") == "grpc.median":
                found[r["case"]] = r
    return found


def emit_summary(
    runs: Sequence[dict[str, float]],
    ratio: Callable[[dict[str, float]], dict[str, float]],
    goals: Callable[[dict[str, float], dict[str, float]], dict[str, bool]],
    reported: dict[str, Any] | None = None,
) -> None:
    """The last line of a benchmark: medians of every figure, the median of each run's ratios
    (each run's figures share that run's machine load), one boolean per goal, and ``reported``
    (figures measured once, outside the runs) when given."""
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    per_run = [ratio(r) for r in runs]
    ratios = {k: round(statistics.median(x[k] for x in per_run), 3) for k in per_run[0]}
    summary = {
        "bench": "summary",
        "runs": len(runs),
        "medians": {k: round(v, 1) for k, v in med.items()},
        "ratios": ratios,
        "goals": goals(med, ratios),
    }
    if reported:
        summary["reported"] = reported
    emit(summary)
