"""A real ``tidemq console`` process and a real browser for the console's tests: Debian's
Chromium (/usr/bin/chromium) driven by Playwright, with no browser download. Each page the test
opens records its console errors, uncaught exceptions and failed requests, so "loads without
errors" is checked, not assumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from tests.integration.conftest import free_port, spawn
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
# As root and on a machine without outside network: no sandbox, and none of Chromium's
# background connections (each would fail, noisily).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
# The console samples this often in the tests (the default is 10 s).
SAMPLE_INTERVAL_S = 0.5


@dataclass
class ConsoleProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "healthz", timeout=2) as r:
            return dict(json.loads(r.read()))

    def samples(self) -> int:
        return int(self.health()["samples"])

    def wait_sampled(self, after: int | None = None) -> None:
        """Until the console has taken a sample that started after now."""
        start = self.samples() if after is None else after
        wait_until(lambda: self.samples() >= start + 2, 20, "the console's next sample")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise AssertionError(
                    "the console did not stop on SIGTERM:\n" + self.log()
                ) from None


@pytest.fixture
def start_console(tmp_path: Path) -> Iterator[Any]:
    started: list[ConsoleProcess] = []

    def start(nameserver: str, *flags: str, env: dict[str, str] | None = None) -> ConsoleProcess:
        port = free_port()
        log_path = tmp_path / f"console-{len(started)}.log"
        args = ["console", "--nameserver", nameserver, "--listen", f"127.0.0.1:{port}"]
        args += ["--sample-interval-s", str(SAMPLE_INTERVAL_S), *flags]
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            proc = spawn(args, log_path)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        console = ConsoleProcess(proc, f"http://127.0.0.1:{port}/", log_path)
        started.append(console)

        def sampled() -> bool:
            assert proc.poll() is None, "the console exited:\n" + console.log()
            try:
                return console.samples() >= 1
            except OSError:  # not listening yet
                return False

        wait_until(sampled, 30, "the console serving its first sample")
        return console

    yield start
    for c in started:
        c.terminate()


@dataclass
class PageProblems:
    """What went wrong in the browser while a page was open."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return [*self.console_errors, *self.page_errors, *self.failed_requests]


@dataclass
class Browser:
    page: Any
    problems: PageProblems


def _chromium_missing() -> str | None:
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMIUM)):
        return f"Debian's chromium is not installed at {CHROMIUM} (make system-deps installs it)"
    return None


@pytest.fixture
def browser() -> Iterator[Browser]:
    missing = _chromium_missing()
    if missing:
        pytest.fail(missing)  # the console's browser tests are required: never a silent skip
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(15_000)
            problems = PageProblems()
            page.on(
                "console",
                lambda m: problems.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: problems.page_errors.append(str(e)))
            page.on(
                "response",
                lambda r: (
                    problems.failed_requests.append(f"{r.status} {r.url}")
                    if r.status >= 500
                    else None
                ),
            )
            yield Browser(page, problems)
        finally:
            chromium.close()
