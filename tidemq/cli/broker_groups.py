"""``tidemq broker-group switchover``: a broker group's mastership, handed over on purpose;
``broker-group config`` (``broker_config``): its settings, changed at runtime.

A *broker group* is a master and its slaves (one broker name); a *consumer group* is a set of
consumers sharing the work (``tidemq consumer-group``). The command was ``tidemq group``, which
read as either; ``group`` still works, and says on stderr that it is deprecated.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from tidemq.admin import Admin
from tidemq.cli import broker_config
from tidemq.cli.common import add_nameserver, print_json

DEPRECATION_NOTE = (
    "tidemq: `tidemq group` is deprecated, use `tidemq broker-group` "
    "(consumer groups: `tidemq consumer-group`)"
)


def cmd_switchover(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        result = admin.switchover(args.group, args.to)
    if args.json:
        print_json(result)
    else:
        print(
            f"{args.group}: broker {result['master_id']} is master at epoch {result['epoch']} "
            f"(sends paused {result['writes_paused_ms']} ms)"
        )
    return 0


def _deprecated(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        print(DEPRECATION_NOTE, file=sys.stderr)
        return func(args)

    return run


def _add(sub: argparse._SubParsersAction, name: str, *, deprecated: bool) -> None:  # type: ignore[type-arg]
    help_text = (
        "deprecated name of broker-group" if deprecated else "broker groups (a master and slaves)"
    )
    g = sub.add_parser(name, help=help_text)
    gsub = g.add_subparsers(dest="broker_group_command", required=True)
    so = gsub.add_parser(
        "switchover", help="hand a group's mastership to an in-sync broker (automatic failover)"
    )
    so.add_argument("group", help="broker group (broker name)")
    so.add_argument("--to", type=int, required=True, metavar="BROKER_ID", help="the new master")
    so.add_argument("--json", action="store_true")
    add_nameserver(so)
    so.set_defaults(func=_deprecated(cmd_switchover) if deprecated else cmd_switchover)
    if not deprecated:
        broker_config.add_parsers(gsub)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _add(sub, "broker-group", deprecated=False)
    _add(sub, "group", deprecated=True)
