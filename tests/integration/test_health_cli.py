"""`tidemq health ADDRESS`: the probe the container image's HEALTHCHECK runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import NameServerProcess, free_port

pytestmark = pytest.mark.integration


def health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "health", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_serving_nameserver_is_healthy(nameserver: NameServerProcess) -> None:
    done = health(nameserver.address)
    assert (done.returncode, done.stdout.strip()) == (0, f"{nameserver.address}: SERVING")
    done = health(nameserver.address, "--service", "tidemq.v1.NameServer")
    assert done.returncode == 0, done.stdout


def test_an_unknown_service_or_a_closed_port_is_unhealthy(nameserver: NameServerProcess) -> None:
    done = health(nameserver.address, "--service", "tidemq.v1.Nothing")
    assert done.returncode == 1
    assert "SERVICE_UNKNOWN" in done.stdout
    done = health(f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert done.returncode == 1
    assert "UNREACHABLE" in done.stdout
