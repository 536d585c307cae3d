"""The command line as a newcomer meets it: ``tidemq dev`` (what ``make run`` starts), then the
client commands against it, each a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import SMALL_STORE, free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60


@dataclass
class Dev:
    proc: subprocess.Popen[str]
    nameserver: str
    out: Path

    def output(self) -> str:
        return self.out.read_text()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        return self.proc.wait(timeout=30)


def start_dev(data: Path, log: Path) -> Dev:
    ns_port, broker_port, console_port = free_port(), free_port(), free_port()
    with log.open("a") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidemq.cli",
                "dev",
                "--data",
                str(data),
                "--nameserver-port",
                str(ns_port),
                "--broker-port",
                str(broker_port),
                "--console-port",
                str(console_port),
                "--store-overrides",
                SMALL_STORE,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    dev = Dev(proc, f"127.0.0.1:{ns_port}", log)

    def up() -> bool:
        assert proc.poll() is None, f"tidemq dev exited:\n{dev.output()}"
        return "cluster is up" in dev.output()

    wait_until(up, START_TIMEOUT_S, "tidemq dev to report the cluster up")
    return dev


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Dev]:
    d = start_dev(tmp_path / "data", tmp_path / "dev.out")
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()


def tidemq(nameserver: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMQ_NAMESERVER": nameserver}
    r = subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if check:
        assert r.returncode == 0, f"tidemq {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_dev_cluster_send_consume_restart_keeps_data(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "dev.out"
    dev = start_dev(data, log)
    try:
        banner = dev.output()
        assert dev.nameserver in banner and "tidemq send" in banner  # next commands shown
        # The web console runs beside the cluster, at the address the banner prints.
        [console_url] = re.findall(r"console\s+(http://\S+)", banner)
        with urllib.request.urlopen(console_url + "healthz", timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        sent = tidemq(
            dev.nameserver, "send", "orders", "hello tidemq", "--tag", "created", "--key", "o-1"
        )
        assert sent.stdout.startswith("SEND_OK ")
        got = tidemq(dev.nameserver, "consume", "orders", "--group", "demo", "--json", "--max", "1")
        [line] = got.stdout.splitlines()
        msg = json.loads(line)
        assert (msg["body"], msg["tag"], msg["keys"]) == ("hello tidemq", "created", ["o-1"])
        assert dev.stop() == 0
        assert "stopped; data kept" in dev.output()
        assert not [p for p in (data / "broker-a").glob("abort")]  # closed cleanly
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
    again = start_dev(data, tmp_path / "dev-again.out")
    try:
        # A new group reads from the start: the message survived the restart.
        got = tidemq(again.nameserver, "consume", "orders", "--group", "other", "--json")
        assert [json.loads(x)["body"] for x in got.stdout.splitlines()] == ["hello tidemq"]
        # The first group committed its offset: nothing new for it.
        again_demo = tidemq(
            again.nameserver, "consume", "orders", "--group", "demo", "--timeout", "1"
        )
        assert again_demo.stdout == ""
        assert again.stop() == 0
    finally:
        if again.proc.poll() is None:
            again.proc.kill()


def test_topic_commands(dev: Dev) -> None:
    ns = dev.nameserver
    created = tidemq(ns, "topic", "create", "payments", "--queues", "3")
    assert "payments ready on broker-a" in created.stdout
    listed = json.loads(tidemq(ns, "topic", "list", "--json").stdout)
    assert listed["payments"]["read_queues"] == 3
    assert "TBW102" not in listed  # the auto-create route is not a user topic
    tidemq(ns, "send", "payments", "p", "--count", "5")
    described = json.loads(
        tidemq(ns, "topic", "describe", "payments", "--group", "g", "--json").stdout
    )
    assert sum(q["max_offset"] for q in described["queues"]) == 5
    assert {q["committed_offset"] for q in described["queues"]} == {None}
    assert "broker-a" in described["brokers"]
    tidemq(ns, "topic", "delete", "payments")
    gone = tidemq(ns, "topic", "describe", "payments", check=False)
    assert gone.returncode == 1
    assert gone.stderr.startswith("tidemq: ROUTE_NOT_FOUND") and gone.stderr.count("\n") == 1


def test_cluster_status_shows_roles_offsets_and_lag(dev: Dev) -> None:
    tidemq(dev.nameserver, "send", "orders", "x", "--count", "10")

    def status() -> dict[str, Any]:
        return dict(json.loads(tidemq(dev.nameserver, "cluster", "status", "--json").stdout))

    def slave_caught_up() -> bool:
        brokers = status()["clusters"][0]["brokers"]
        slaves = brokers[0]["replication"]["slaves"]
        return len(slaves) == 1 and slaves[0]["lag_bytes"] == 0 and slaves[0]["in_sync"]

    wait_until(slave_caught_up, 30, "the dev cluster's slave to catch up")
    st = status()
    assert st["nameserver"]["registry"] == "embedded"
    [cluster] = st["clusters"]
    master, slave = cluster["brokers"]
    assert cluster["cluster"] == "DevCluster"
    assert [(b["broker_name"], b["broker_id"], b["role"]) for b in (master, slave)] == [
        ("broker-a", 0, "ASYNC_MASTER"),
        ("broker-a", 1, "SLAVE"),
    ]
    assert master["reachable"] and master["store"]["writable"]
    end = master["store"]["commitlog_max_offset"]
    assert end > 0 and slave["store"]["commitlog_max_offset"] == end
    assert master["replication"]["slaves"][0]["address"] == slave["address"]
    assert slave["replication"]["master"]["address"] == master["address"]
    text = tidemq(dev.nameserver, "cluster", "status").stdout
    assert "broker-a/0 ASYNC_MASTER" in text and "broker-a/1 SLAVE" in text
    assert "behind 0 bytes" in text and "(streaming)" in text


def test_errors_are_one_line_without_traceback(dev: Dev) -> None:
    bad = tidemq(dev.nameserver, "send", "bad topic!", "x", check=False)
    assert bad.returncode == 1
    assert bad.stderr.startswith("tidemq: INVALID_TOPIC") and bad.stderr.count("\n") == 1
    nobody = tidemq(f"127.0.0.1:{free_port()}", "topic", "list", check=False)
    assert nobody.returncode == 1 and "Traceback" not in nobody.stderr
    assert nobody.stderr.startswith("tidemq: UNAVAILABLE") and nobody.stderr.count("\n") == 1
    usage = tidemq(dev.nameserver, "send", "t", "x", "--property", "novalue", check=False)
    assert usage.returncode == 2 and "NAME=VALUE" in usage.stderr


def test_bench_produce_and_consume_print_json(dev: Dev) -> None:
    ns = dev.nameserver
    args = ("--topic", "b", "--messages", "3000", "--json")
    produced = json.loads(tidemq(ns, "bench", "produce", *args, "--body-bytes", "256").stdout)
    assert produced["statuses"] == {"SEND_OK": 3000}
    assert produced["msgs_per_s"] > 0 and produced["messages_per_request"] > 1
    unbatched = json.loads(
        tidemq(
            ns, "bench", "produce", "--unbatched", "--topic", "b", "--messages", "200", "--json"
        ).stdout
    )
    assert unbatched["messages_per_request"] == 1 and unbatched["p99_us"] >= unbatched["p50_us"]
    consumed = json.loads(tidemq(ns, "bench", "consume", *args).stdout)
    # The topic holds more (warm-up messages): the bench stops once it has read what it asked.
    assert consumed["complete"] and consumed["messages"] >= 3000


def test_dev_refuses_a_port_in_use(dev: Dev, tmp_path: Path) -> None:
    port = dev.nameserver.rsplit(":", 1)[1]
    r = subprocess.run(
        [
            *(sys.executable, "-m", "tidemq.cli", "dev", "--data", str(tmp_path / "x")),
            *("--nameserver-port", port, "--broker-port", str(free_port())),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1 and "in use" in r.stderr
    assert dev.proc.poll() is None  # the running cluster is untouched
    assert tidemq(dev.nameserver, "cluster", "status").returncode == 0


def test_a_killed_dev_takes_its_nameserver_broker_and_console_with_it(tmp_path: Path) -> None:
    dev = start_dev(tmp_path / "data", tmp_path / "dev.out")
    [console_url] = re.findall(r"console\s+(http://\S+)", dev.output())
    host, port = dev.nameserver.rsplit(":", 1)
    dev.proc.kill()  # SIGKILL: dev cannot stop its children itself
    dev.proc.wait()

    def answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except OSError:
            return False

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex((host, int(port))) == 0

    wait_until(lambda: not answers(console_url + "healthz"), 20, "the console to exit")
    wait_until(lambda: not listening(), 20, "the nameserver to exit")
