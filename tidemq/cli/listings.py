"""Cluster-wide listings with a total (``delayed list``, ``transactions list``, ``dlq list``):
their ``--limit``/``--json`` options, and a page of rows printed as a table with "N of TOTAL"
on stderr, or as one JSON object."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tidemq.cli.common import print_json
from tidemq.cli.tables import Cell, print_table


def add_listing_options(p: argparse.ArgumentParser, json_help: str) -> None:
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true", help=json_help)


def check_limit(limit: int) -> None:
    if limit <= 0:
        raise ValueError("--limit must be > 0")


def print_listing(
    items: Sequence[Any],
    total: int,
    *,
    what: str,
    json_key: str,
    headers: Sequence[str],
    row: Callable[[Any], Sequence[Cell]],
    as_json: bool,
) -> None:
    """``items`` (each with ``as_dict``), ``total`` of them on the brokers: as JSON under
    ``json_key``, or a table with "N of TOTAL ``what``" on stderr ("no ``what``" when empty)."""
    if as_json:
        print_json({"total": total, json_key: [i.as_dict() for i in items]})
        return
    if not items:
        print(f"no {what}")
        return
    print_table(headers, [row(i) for i in items])
    print(f"{len(items)} of {total} {what}", file=sys.stderr)
