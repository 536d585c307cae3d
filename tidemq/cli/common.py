"""What every client command shares: the ``--nameserver`` flag and JSON output."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tidemq._runtime import DEFAULT_NAMESERVER, NAMESERVER_ENV


def add_nameserver(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nameserver",
        metavar="HOST:PORT[,...]",
        help=f"nameserver address(es) (default ${NAMESERVER_ENV} or {DEFAULT_NAMESERVER})",
    )


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
