"""The RocketMQ 5 protocol benchmark at a CI size: ``bench/rocketmq_bench.py`` (what ``make
bench`` runs) loads one broker through both protocols, tidemq's SDK on tidemq's own and the
official Python client (its own environment and process) on the v2 listener, and reports each
one's rate, latency and broker CPU per message, and their ratio beside the goal. A test of the
benchmark's plumbing: it asserts what was measured and delivered, never how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.interop.clients import ROCKETMQ_PYTHON, ROOT

pytestmark = pytest.mark.integration

MESSAGES = 300
WARMUP = 50
CONCURRENCY = 4
BATCHED = 2_000


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_rocketmq_bench_measures_both_protocols_and_their_broker_cpu_ratio() -> None:
    assert ROCKETMQ_PYTHON.exists(), f"{ROCKETMQ_PYTHON} is missing: run `make interop-deps`"
    r = subprocess.run(
        [
            sys.executable,
            "bench/rocketmq_bench.py",
            "--perfkit",
            "",
            "--runs",
            "1",
            "--messages",
            str(MESSAGES),
            "--warmup",
            str(WARMUP),
            "--concurrency",
            str(CONCURRENCY),
            "--batched-messages",
            str(BATCHED),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=150,
        check=False,
    )
    assert r.returncode == 0, f"rocketmq_bench.py failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    by_bench = {line["bench"]: line for line in lines_of(r.stdout)}
    for name in ("own", "v2"):
        case = by_bench[name]
        # Every message answered SEND_OK and stored once, warm-up included.
        assert case["statuses"] == {"SEND_OK": MESSAGES}, case
        assert case["stored"] == MESSAGES + WARMUP and case["stored_as_sent"], case
        assert (case["messages"], case["concurrency"]) == (MESSAGES, CONCURRENCY), case
        assert case["msgs_per_s"] > 0 and case["broker_cpu_us_per_msg"] > 0, case
        assert 0 < case["p50_us"] <= case["p99_us"], case
    assert by_bench["own"]["messages_per_request"] == 1, by_bench["own"]  # as the client's
    batched = by_bench["own_batched"]
    assert batched["statuses"] == {"SEND_OK": BATCHED} and batched["stored_as_sent"], batched
    assert batched["messages_per_request"] > 1, batched  # the SDK batched: one call, many
    summary = by_bench["summary"]
    ratio = summary["ratios"]["v2_vs_own_broker_cpu_per_msg"]
    expected = by_bench["v2"]["broker_cpu_us_per_msg"] / by_bench["own"]["broker_cpu_us_per_msg"]
    assert ratio == pytest.approx(expected, rel=0.01), summary
    assert summary["goals"] == {"v2_broker_cpu_per_msg_le_1_5x_own": ratio <= 1.5}, summary
    assert summary["reported"]["concurrency"] == CONCURRENCY, summary
