"""The metric names tidemq's servers export, scraped from real processes: a nameserver and a
broker group of a master and a slave on loopback, each with ``--metrics-listen``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

START_TIMEOUT_S = 60.0
# Small store files: a test broker should not reserve gigabytes of disk.
SMALL_STORE = (
    '{"commitlog_file_size_bytes": 4194304, "consume_queue_entries_per_file": 10000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text: str = reply.read().decode()
        return text


def sample_names(exposition: str) -> set[str]:
    """Every series name a scrape of ``exposition`` gives Prometheus, including those of families
    that have no sample yet (a labelled counter before its first increment): counters as
    ``_total``, histograms as ``_bucket``/``_sum``/``_count``."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


@contextmanager
def _process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_for(address: str, proc: subprocess.Popen[bytes], log: Path, needle: str) -> str:
    """The first scrape of ``address`` that contains ``needle``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()}")
        try:
            text = _scrape(address)
        except (urllib.error.URLError, ConnectionError):
            text = ""
        if needle in text:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{address}: no {needle!r} in time:\n{log.read_text()}")
        time.sleep(0.2)


def scrape_a_cluster(tmp: Path) -> dict[str, set[str]]:
    """Series names by process: ``nameserver``, ``master``, ``slave``."""
    ns, ns_metrics = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    found: dict[str, set[str]] = {}
    with _process(
        ["nameserver", "--listen", ns, "--metrics-listen", ns_metrics], tmp / "nameserver.log"
    ) as ns_proc:
        brokers = []
        for role, broker_id in (("ASYNC_MASTER", "0"), ("SLAVE", "1")):
            listen, metrics = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
            brokers.append((role, metrics, tmp / f"{role}.log", [
                "broker", "--listen", listen, "--store", str(tmp / role), "--nameserver", ns,
                "--broker-name", "broker-a", "--broker-id", broker_id, "--role", role,
                "--register-interval-ms", "500", "--store-overrides", SMALL_STORE,
                "--metrics-listen", metrics,
            ]))  # fmt: skip
        with (
            _process(brokers[0][3], brokers[0][2]) as master,
            _process(brokers[1][3], brokers[1][2]) as slave,
        ):
            # Each family appears once its process serves; the slave's link once it is up, and
            # the master's per-slave series once the slave has reported.
            found["master"] = sample_names(
                _wait_for(brokers[0][1], master, brokers[0][2], "tidemq_replication_slave_in_sync{")
            )
            found["slave"] = sample_names(
                _wait_for(brokers[1][1], slave, brokers[1][2], "tidemq_replication_connected 1")
            )
            found["nameserver"] = sample_names(
                _wait_for(ns_metrics, ns_proc, tmp / "nameserver.log", "tidemq_")
            )
    return found
