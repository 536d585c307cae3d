"""The ``tidemq`` command line.

The client commands (topic, send, consume, message, receive, delayed, transactions,
consumer-group, dlq, cluster, broker-group, bench, health, completion) belong to the SDK and
are added here. The server commands (``broker``, ``nameserver``, ``dev``, ``store``, ``pipeline``)
register themselves: each names a function in the ``tidemq.commands`` entry-point group
(pyproject.toml) that adds its subcommand, so this module imports no server code and a
client-only use of the CLI loads none.

Every command sets ``func`` (it returns the exit code) and may set ``log_level``: servers log
their lifecycle by default, offline tools stay quiet unless ``-v`` or ``--log-level`` is given.
``--log-format json`` (``tidemq.logs``) goes on any command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from tidemq import health, logs
from tidemq.cli import (
    bench,
    broker_groups,
    cluster,
    completion,
    consumer_groups,
    delayed,
    dlq,
    message_views,
    messages,
    receive,
    topics,
    transactions,
)
from tidemq.cli.common import export_tls
from tidemq.errors import TidemqError

COMMANDS_GROUP = "tidemq.commands"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidemq", description="tidemq message broker")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (
        topics,
        messages,
        message_views,
        receive,
        delayed,
        transactions,
        consumer_groups,
        dlq,
        cluster,
        broker_groups,
        bench,
    ):
        module.add_parsers(sub)
    health.add_parser(sub)
    completion.add_parser(sub, p)
    for command in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        command.load()(sub)
    logs.add_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(logs.format_of(args), logs.level_of(args))
    try:
        export_tls(args)
        rc: int = args.func(args)
    except TidemqError as e:
        print(f"tidemq: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"tidemq: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return rc
