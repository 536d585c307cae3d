"""Web console pages with 1,000 topics and 1,000 consumer groups (docs/console.md; goal: every
page renders in under 300 ms).

usage: python bench/console_bench.py [--runs 3] [--topics 1000] [--groups 1000] [--perfkit DIR]

One nameserver and one ASYNC broker (processes on 127.0.0.1) are given ``--topics`` topics of
4 queues and ``--groups`` consumer groups, each group with committed offsets on one topic; then
a ``tidemq console`` process samples them. Each run times every page ``--requests`` times from
this process (HTTP on loopback, the whole answer read): the median and p90 per page, the
slowest page's median beside the goal. Beside them, measured in the same run: the console's
HTTP floor (``/healthz``, no work) and the admin calls the heaviest pages wait on
(``list_topics``, ``list_consumer_groups``) made directly; perfkit's ``calib.py`` tells how much
CPU one Python thread got. One JSON object per line, last a ``summary``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, TIDEMQ, Process, emit, emit_summary, free_port, wait_until
from receive_broker import BenchBroker

sys.path.insert(0, REPO)

from tidemq.admin import AsyncAdmin

GOAL_MS = 300.0
QUEUES = 4


async def _populate(nameserver: str, topics: int, groups: int) -> None:
    async with AsyncAdmin(nameserver) as admin:
        names = [f"bench-topic-{i:05d}" for i in range(topics)]
        for start in range(0, topics, 50):
            await asyncio.gather(
                *(
                    admin.create_topic(t, queues=QUEUES, wait=False)
                    for t in names[start : start + 50]
                )
            )
        # The last one waits for the route, so every topic is routed before the offsets.
        await admin.create_topic(names[-1], queues=QUEUES)
        for start in range(0, groups, 50):
            batch = range(start, min(start + 50, groups))
            await asyncio.gather(
                *(admin.update_consumer_group(f"bench-group-{i:05d}") for i in batch)
            )
            await asyncio.gather(
                *(
                    admin.reset_offsets(f"bench-group-{i:05d}", names[i % topics], "first")
                    for i in batch
                )
            )


def _get_ms(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")
    return (time.perf_counter() - started) * 1000


async def _admin_ms(nameserver: str, requests: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with AsyncAdmin(nameserver) as admin:
        for name, call in (
            ("list_topics", admin.list_topics),
            ("list_groups", admin.list_consumer_groups),
        ):
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                await call()
                times.append((time.perf_counter() - started) * 1000)
            out[f"admin_{name}_ms"] = statistics.median(times)
    return out


def _calib(perfkit: str | None) -> dict[str, Any]:
    if not perfkit:
        return {}
    r = subprocess.run(
        [sys.executable, "calib.py", "--label", "console"], cwd=perfkit, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    line = r.stdout.strip().splitlines()[-1]  # "RESULT {...}"
    return dict(json.loads(line.partition(" ")[2]))


def run_once(run: int, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    d = Path(scratch) / f"run{run}"
    with BenchBroker(str(d), str(d / "store")) as broker:
        started = time.perf_counter()
        asyncio.run(_populate(broker.nameserver, args.topics, args.groups))
        populate_s = time.perf_counter() - started
        port = free_port()
        console = Process(
            "console",
            [*TIDEMQ, "console", "--nameserver", broker.nameserver, "--listen",
             f"127.0.0.1:{port}", "--sample-interval-s", "5"],
            str(d / "console.log"),
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:

            def sampled() -> bool:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                        return bool(json.loads(r.read())["samples"] >= 1)
                except OSError:
                    return False

            wait_until(sampled, "the console's first sample", [console])
            pages = {
                "cluster": "/",
                "topics": "/topics",
                "topic": "/topics/bench-topic-00500",
                "groups": "/groups",
                "group": "/groups/bench-group-00500",
                "dlq": "/dlq",
                "pending": "/pending",
                "messages": "/messages",
            }
            figures: dict[str, float] = {"populate_s": populate_s}
            floor = [_get_ms(base + "/healthz") for _ in range(args.requests)]
            figures["http_floor_ms"] = statistics.median(floor)
            for name, path in pages.items():
                _get_ms(base + path)  # warm: templates compiled, channels open
                times = sorted(_get_ms(base + path) for _ in range(args.requests))
                figures[f"{name}_median_ms"] = statistics.median(times)
                figures[f"{name}_p90_ms"] = times[int(0.9 * (len(times) - 1))]
            figures.update(asyncio.run(_admin_ms(broker.nameserver, args.requests)))
            figures["slowest_page_median_ms"] = max(
                v for k, v in figures.items() if k.endswith("_median_ms")
            )
            rounded = {k: round(v, 2) for k, v in figures.items()}
            emit(
                {"bench": "console_pages", "run": run, "topics": args.topics,
                 "groups": args.groups, **rounded}
            )  # fmt: skip
            return figures
        finally:
            console.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--groups", type=int, default=1000)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--perfkit", default=None)
    args = p.parse_args()
    for var in [k for k in os.environ if k.startswith("TIDEMQ_")]:
        del os.environ[var]
    runs = []
    with tempfile.TemporaryDirectory(prefix="tidemq-console-bench-") as scratch:
        for run in range(args.runs):
            runs.append(run_once(run, args, scratch))

    def ratio(r: dict[str, float]) -> dict[str, float]:
        return {"slowest_page_vs_goal": r["slowest_page_median_ms"] / GOAL_MS}

    def goals(med: dict[str, float], _ratios: dict[str, float]) -> dict[str, bool]:
        return {"every_page_under_300_ms": med["slowest_page_median_ms"] < GOAL_MS}

    emit_summary(runs, ratio, goals, reported={"calib": _calib(args.perfkit)})


if __name__ == "__main__":
    main()
