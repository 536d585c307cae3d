"""The authentication flags every server takes (``tidemq nameserver``, ``tidemq broker``)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_CLOCK_SKEW_MS = 900_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--acl-file",
        metavar="PATH",
        help="accounts and permissions in RocketMQ's plain_acl.yml format; every call must "
        "then be signed by an account that may make it (re-read when the file changes)",
    )
    parser.add_argument(
        "--auth-max-clock-skew-ms",
        type=int,
        metavar="N",
        help="how far a signed request's date may be from this server's clock "
        f"(default {DEFAULT_MAX_CLOCK_SKEW_MS})",
    )
