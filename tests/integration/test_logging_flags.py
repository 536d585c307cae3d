"""A real server process with ``--log-format json``: every line it writes is one JSON object
with the fields a log shipper reads, and ``--log-level warning`` silences its lifecycle lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.conftest import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def serving(port: int) -> bool:
    """Whether the server answers its health check SERVING (it has its signal handlers then)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def run_nameserver(*flags: str) -> list[str]:
    """The nameserver's stderr lines from its start to a SIGTERM once it serves."""
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli", "nameserver", "--listen", f"127.0.0.1:{port}", *flags],
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        wait_until(lambda: serving(port) or proc.poll() is not None, 30, "the nameserver to serve")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err.splitlines()


def test_a_server_logs_json_lines_and_the_level_the_flag_asks_for() -> None:
    lines = [json.loads(line) for line in run_nameserver("--log-format", "json")]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert "nameserver serving on" in lines[0]["message"]
    assert lines[-1]["message"] == "nameserver stopped"
    assert {d["level"] for d in lines} == {"INFO"}

    quiet = run_nameserver("--log-format", "json", "--log-level", "warning")
    assert quiet == []
