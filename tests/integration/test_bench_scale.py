"""The scale benchmark at a small size: ``bench/scale_bench.py`` (what ``make bench`` runs)
restarts a broker at each topic count, measures creates, propagation and route queries, and
prints each level, the gRPC ceiling of the perfkit it is pointed at, and the goals. The figures
are checked for sense, not against the goals: two small levels on a busy machine say nothing
about 100,000 topics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# perfkit's grpc_bench.py prints "RESULT {json}" lines; this stand-in prints the one the
# benchmark reads, at once.
FAKE_GRPC = """
import json
print("RESULT " + json.dumps({"bench": "grpc.median", "server": "aio", "case": "unary_c1",
                              "p50_us": 250.0, "p99_us": 900.0}))
"""


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_scale_bench_prints_each_level_the_ceiling_and_the_goals(tmp_path: Path) -> None:
    perfkit = tmp_path / "perfkit"
    perfkit.mkdir()
    (perfkit / "grpc_bench.py").write_text(FAKE_GRPC)
    r = subprocess.run(
        [
            sys.executable, "bench/scale_bench.py", "--perfkit", str(perfkit),
            "--levels", "100,1500", "--sample", "10", "--queries", "50",
        ],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 0, f"scale_bench.py failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    lines = lines_of(r.stdout)
    levels = [line for line in lines if line["bench"] == "scale.level"]
    assert [level["topics"] for level in levels] == [100, 1500]
    for level in levels:
        assert 0 < level["restart_s"] <= level["routable_s"]
        assert level["create_ms_median"] > 0 and level["propagation_ms_median"] > 0
        assert 0 < level["route_query_ms_p50"] <= level["route_query_ms_p99"]
        assert level["broker_rss_mib"] > 0 and level["nameserver_rss_mib"] > 0
    summary = lines[-1]
    assert summary["bench"] == "summary"
    assert summary["ceiling"] == {"grpc_unary_ms_p50": 0.25, "grpc_unary_ms_p99": 0.9}
    assert summary["create_ms_median"] == {
        "100": levels[0]["create_ms_median"],
        "1500": levels[1]["create_ms_median"],
    }
    assert set(summary["goals"]) == {
        "create_at_last_within_2x_first",
        "restart_within_10s",
        "route_query_p99_within_5ms",
    }
