"""A member of a receive group in a process of its own (its own client id, channels and GIL),
for histories with members in several processes.

The child (``python -m tests.integration.receive_member ...``) runs one ``Member`` and writes
every delivery as one JSON line to its output file once the delivery ended (acked, nacked,
dropped, refused); SIGTERM stops it, and it exits 0 unless the member failed. The parent side,
``MemberProcess``, reads those lines into the test's ``DeliveryLog`` as they come.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.integration.receivers import PLANS, Delivery, DeliveryLog, Member, Outcome

REPO = Path(__file__).parents[2]


class _LineLog(DeliveryLog):
    """A DeliveryLog that also appends each ended delivery to a file, one JSON line each."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._out = path.open("a", buffering=1)
        self._write_lock = threading.Lock()

    def ended(self, d: Delivery, outcome: Outcome, at_ms: float, error: str = "") -> None:
        super().ended(d, outcome, at_ms, error)
        with self._write_lock:
            self._out.write(json.dumps(d.as_json()) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--nameserver", "--group", "--topic", "--name", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--plan", choices=sorted(PLANS), default="ack")
    p.add_argument("--invisible-s", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args(argv)
    log = _LineLog(Path(a.out))
    member = Member(
        a.name,
        a.nameserver,
        a.group,
        a.topic,
        log,
        plan=PLANS[a.plan],
        invisible_s=a.invisible_s,
        batch=a.batch,
    )
    signal.signal(signal.SIGTERM, lambda *_: member.stop.set())
    member.start()
    while member.is_alive():
        member.join(0.1)
    member.check()
    return 0


class MemberProcess:
    """The parent's handle on a member process: start, read its deliveries, stop."""

    def __init__(self, out: Path, *args: str) -> None:
        self.out = out
        self.out.touch()
        self._stderr = out.with_suffix(".stderr")
        self._read_at = 0
        with self._stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.receive_member",
                    "--out",
                    str(out),
                    *args,
                ],
                # The child imports tests.*: from the repository, whatever the working directory.
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        """True while it runs (or ended well); its stderr as the failure once it exited badly."""
        code = self.proc.poll()
        if code not in (None, 0):
            raise AssertionError(f"member process exited {code}:\n{self._stderr.read_text()}")
        return True

    def read_into(self, log: DeliveryLog) -> None:
        """Record the deliveries it wrote since the last read (whole lines only)."""
        with self.out.open() as f:
            f.seek(self._read_at)
            while (line := f.readline()).endswith("\n"):
                self._read_at = f.tell()
                d = Delivery.from_json(json.loads(line))
                outcome, ended_at, error = d.outcome, d.ended_at_ms, d.error
                d.outcome = Outcome.HELD
                log.record(d)
                log.ended(d, outcome, ended_at or 0.0, error)

    def stop(self, log: DeliveryLog, timeout_s: float = 30) -> None:
        """SIGTERM, wait for a clean exit, and read the rest of its deliveries."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"member process ignored SIGTERM for {timeout_s} s") from None
        self.healthy()
        self.read_into(log)


def args_for(nameserver: str, group: str, topic: str, name: str, **options: Any) -> list[str]:
    out = ["--nameserver", nameserver, "--group", group, "--topic", topic, "--name", name]
    for k, v in options.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


if __name__ == "__main__":
    sys.exit(main())
