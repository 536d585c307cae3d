"""The production-semantics benchmark at a CI size: ``bench/production_bench.py`` (what ``make
bench`` runs) measures every figure it promises on a real broker, and ``tidemq bench
production`` runs each mode against any cluster, its JSON saying what was delivered, stored and
left open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIMER_MESSAGES = 2_000
WINDOW_S = 3
PRODUCE_MESSAGES = 3_000
TRANSACTIONS = 150
# Lateness bound of the smoke run: well above the goal (1 s): the machine runs other tests.
SANE_LATENESS_MS = 5_000


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_production_bench_measures_each_figure_beside_its_goal() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "bench/production_bench.py",
            "--perfkit",
            "",
            "--runs",
            "1",
            "--messages",
            str(PRODUCE_MESSAGES),
            "--transactions",
            str(TRANSACTIONS),
            "--concurrency",
            "4",
            "--timer-messages",
            str(TIMER_MESSAGES),
            "--window-s",
            str(WINDOW_S),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=150,
        check=False,
    )
    assert r.returncode == 0, f"production_bench.py failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    by_bench = {line["bench"]: line for line in lines_of(r.stdout)}
    for name in ("plain", "idempotent"):
        p = by_bench[name]
        assert p["stored_as_sent"] and p["statuses"] == {"SEND_OK": PRODUCE_MESSAGES}, p
        assert p["msgs_per_s"] > 0 and p["broker_cpu_us_per_msg"] > 0, p
    t = by_bench["transactions"]
    assert (t["committed"], t["stored_as_committed"], t["left_open"]) == (
        TRANSACTIONS,
        True,
        0,
    ), t
    assert (t["errors"], t["checks_received"]) == ({}, 0), t
    assert t["txn_per_s"] > 0 and t["broker_cpu_us_per_txn"] > 0, t
    timer = by_bench["timer"]
    # Every timer pending once scheduled, none left after the window, each delivered once.
    assert timer["schedule_overran_first_due_ms"] == 0, timer
    assert timer["pending_when_scheduled"] == TIMER_MESSAGES, timer
    assert timer["pending_when_due"] == 0, timer
    assert (timer["delivered"], timer["duplicates"], timer["early"]) == (TIMER_MESSAGES, 0, 0)
    assert (timer["sent"], timer["send_errors"]) == (TIMER_MESSAGES, {}), timer
    assert (timer["without_recall_handle"], timer["deliver_at_differs"]) == (0, 0), timer
    assert 0 <= timer["lateness_p50_ms"] <= timer["lateness_p99_ms"] <= timer["lateness_max_ms"]
    assert timer["lateness_p99_ms"] < SANE_LATENESS_MS, timer
    assert timer["rss_anon_before_bytes"] > 0 and timer["extrapolated_to_million"], timer
    assert timer["broker_schedule_cpu_us_per_msg"] > 0, timer
    assert timer["broker_fire_cpu_us_per_msg"] > 0 and timer["fire_msgs_per_s"] > 0, timer
    summary = by_bench["summary"]
    assert summary["ratios"]["idempotent_vs_plain"] > 0, summary
    assert set(summary["goals"]) == {
        "idempotent_ge_90pct_plain",
        "timer_p99_le_1s",
        "timer_heap_le_64MiB_per_million_pending",
        "timer_each_delivered_once_none_early",
    }, summary
    assert summary["goals"]["timer_each_delivered_once_none_early"], summary
    assert summary["reported"]["timer_lateness_p99_ms"] == timer["lateness_p99_ms"], summary


def bench_production(nameserver: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", "bench", "production", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TIDEMQ_NAMESERVER": nameserver},
        timeout=120,
        check=False,
    )


@pytest.fixture
def nameserver(start_nameserver: StartNameServer, start_broker: StartBroker) -> str:
    ns = start_nameserver()
    start_broker("--nameserver", ns.address, "--broker-name", "broker-a", "--auto-create-topics")
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master broker routed")
    return ns.address


def test_bench_production_runs_each_mode_against_a_cluster(nameserver: str) -> None:
    def run(*args: str) -> dict[str, Any]:
        r = bench_production(nameserver, *args, "--json")
        assert r.returncode == 0, f"tidemq bench production failed:\n{r.stdout}\n{r.stderr}"
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    timer = run("--mode", "timer", "--messages", "500", "--window-s", "1", "--body-bytes", "64")
    assert (timer["delivered"], timer["early"], timer["duplicates"]) == (500, 0, 0), timer
    assert timer["lateness_p99_ms"] < SANE_LATENESS_MS, timer
    for mode in ("plain", "idempotent"):
        p = run("--mode", mode, "--messages", "1000")
        assert (p["idempotent"], p["statuses"]) == (mode == "idempotent", {"SEND_OK": 1000}), p
    t = run("--mode", "transactions", "--messages", "50", "--concurrency", "2")
    assert (t["committed"], t["errors"], t["complete"]) == (50, {}, True), t


def test_bench_production_refuses_a_bad_mode_and_sizes() -> None:
    # Refused before any connection: no cluster needed (nothing listens on port 1).
    nameserver = "127.0.0.1:1"
    refusals = {
        ("--mode", "delay"): "invalid choice: 'delay'",
        ("--messages", "0"): "--messages and --window-s must be > 0",
        ("--mode", "timer", "--window-s", "-1"): "--messages and --window-s must be > 0",
        ("--mode", "transactions", "--concurrency", "0"): "--concurrency must be > 0",
    }
    for args, says in refusals.items():
        r = bench_production(nameserver, *args)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
