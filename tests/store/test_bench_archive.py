"""The archive benchmark at a tiny size: ``bench/archive_bench.py`` (what ``make bench`` runs)
produces, archives (directory, both compressions, and moto's S3), reads locally and from the
archive past retention, and prints every figure, the ceilings of a perfkit it is pointed at, the
ratios and the goals. The figures are checked for sense, not against the goals: a tiny store on
a busy machine says nothing about them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.store

REPO = Path(__file__).resolve().parents[2]

# perfkit's scripts print "RESULT {json}" lines; these stand-ins print the ones the benchmark
# reads, at once (the real disk.py writes gigabytes).
FAKE_DISK = """
import json
def emit(**kv):
    print("RESULT " + json.dumps(kv))
emit(bench="disk.dd", bs="1M", flag="oflag=dsync", MBps_median=300.0, MBps_runs=[300.0])
emit(bench="disk.dd", bs="1M", flag="conv=fdatasync", MBps_median=1300.0, MBps_runs=[1300.0])
emit(bench="disk.py_write_1GiB_then_fdatasync", write_MBps=4000.0, fdatasync_MBps=3000.0,
     total_MBps=2000.0, total_runs=[2000])
"""
FAKE_CALIB = """
import json
print("RESULT " + json.dumps({"bench": "calib", "loop_Mps": 20.0, "cpu_share": 1.0}))
"""


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_archive_bench_prints_each_figure_beside_its_ceiling_and_goal(tmp_path: Path) -> None:
    perfkit = tmp_path / "perfkit"
    perfkit.mkdir()
    (perfkit / "disk.py").write_text(FAKE_DISK)
    (perfkit / "calib.py").write_text(FAKE_CALIB)
    r = subprocess.run(
        [
            sys.executable, "bench/archive_bench.py", "--perfkit", str(perfkit), "--runs", "1",
            "--mb", "6", "--file-mib", "2", "--chunk-mib", "1", "--queues", "3", "--s3",
        ],
        capture_output=True, text=True, cwd=REPO, timeout=240, check=False,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 0, f"archive_bench.py failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    by_bench = {line["bench"]: line for line in lines_of(r.stdout)}
    assert set(by_bench) == {"config", "ceiling.disk", "run", "summary"}, by_bench.keys()
    assert by_bench["ceiling.disk"]["py_write_then_fdatasync_MBps"] == 2000.0
    run = by_bench["run"]
    # Two sealed 2 MiB files at least, each archived whole, in 1 MiB chunks.
    assert run["archive_dir_zstd_files"] >= 2, run
    for label in ("dir_none", "dir_zstd", "moto_s3_zstd"):
        assert run[f"archive_{label}_MBps"] > 0, (label, run)
        assert run[f"archive_{label}_cpu_ms_per_MB"] > 0, (label, run)
        assert run[f"archive_{label}_files"] == run["archive_dir_zstd_files"], (label, run)
    assert run["archive_dir_none_stored_ratio"] == 1.0, run
    assert 0.2 < run["archive_dir_zstd_stored_ratio"] < 0.9, run  # the text bodies compress
    assert run["produce_MBps"] > 0 and run["produce_cpu_ms_per_MB"] > 0, run
    for read in ("local", "archive_cold", "archive_warm", "group_local", "group_archive_cold"):
        assert run[f"read_{read}_MBps"] > 0 and run[f"read_{read}_msgs_per_s"] > 0, (read, run)
    # Cold: every chunk of the range fetched once; warm: none.
    assert run["read_archive_cold_chunk_fetches"] >= 2 * run["archive_dir_zstd_files"], run
    assert run["read_archive_warm_chunk_fetches"] == 0, run
    summary = by_bench["summary"]
    assert summary["runs"] == 1 and summary["medians"]["produce_MBps"] == run["produce_MBps"]
    ratios = summary["ratios"]
    assert ratios["archive_zstd_vs_produce"] == pytest.approx(
        run["archive_dir_zstd_MBps"] / run["produce_MBps"], rel=1e-2
    )
    assert ratios["archive_zstd_stored_vs_disk_ceiling"] == pytest.approx(
        run["archive_dir_zstd_stored_MBps"] / 2000.0, rel=1e-2
    )
    assert all(v > 0 for v in ratios.values()), ratios
    assert set(summary["goals"]) == {
        "archive_zstd_ge_0.5_produce",
        "archive_none_ge_0.5_produce",
        "read_archive_cold_ge_0.3_local",
        "read_archive_warm_ge_0.3_local",
        "read_group_archive_cold_ge_0.3_local",
    }, summary
    assert all(isinstance(v, bool) for v in summary["goals"].values()), summary
    assert (
        summary["ceilings"]["calib"] == [{"bench": "calib", "loop_Mps": 20.0, "cpu_share": 1.0}] * 2
    )
