"""The broker's command-line flags for its limits (docs/operations.md, "Limits")."""

from __future__ import annotations

import argparse

from tidemq.services.broker.limits import DEFAULT_MAX_GROUPS, DEFAULT_MAX_TOPICS

# The BrokerConfig fields these flags set.
KEYS = ("max_topics", "max_groups", "metrics_queue_series_max")


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-topics",
        type=int,
        metavar="N",
        help=f"topics this broker holds at most; creating more is refused (default "
        f"{DEFAULT_MAX_TOPICS})",
    )
    p.add_argument(
        "--max-groups",
        type=int,
        metavar="N",
        help=f"consumer groups this broker holds at most; creating more is refused (default "
        f"{DEFAULT_MAX_GROUPS})",
    )
    p.add_argument(
        "--metrics-queue-series-max",
        type=int,
        metavar="N",
        help="per-queue series in /metrics at most, per metric; the rest are counted in "
        "tidemq_metrics_queue_series_omitted (default 20000)",
    )
