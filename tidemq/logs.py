"""How every ``tidemq`` process logs: ``--log-format text|json`` and ``--log-level``, on every
command (servers and tools alike).

JSON lines carry ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus
``exc_info`` with the traceback when there is one: what log shippers (Fluent Bit, Vector, Loki's
promtail) parse without a pattern. python-json-logger does the encoding.
"""

from __future__ import annotations

import argparse
import logging
import time

from pythonjsonlogger.json import JsonFormatter

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _UtcJsonFormatter(JsonFormatter):
    converter = time.gmtime  # type: ignore[assignment]  # "time" is UTC, whatever the host's zone


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return _UtcJsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            datefmt="%Y-%m-%dT%H:%M:%S%z",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    return logging.Formatter(TEXT_FORMAT)


def configure(log_format: str, level: int) -> None:
    """Root logging to stderr in ``log_format`` at ``level``, replacing what was set before."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level`` on ``parser`` and every subcommand under it, so they
    go where a user puts them (``tidemq broker --log-format json``)."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-format",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="text (default) or json: one JSON object a line, for log shippers",
    )
    group.add_argument(
        "--log-level",
        dest="log_level_name",  # "log_level" is each command's default level, a number
        choices=LEVELS,
        default=argparse.SUPPRESS,
        help="the least severe level logged (default: info for servers, warning for tools)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                add_flags(sub)


def format_of(args: argparse.Namespace) -> str:
    return str(getattr(args, "log_format", "text"))


def level_of(args: argparse.Namespace) -> int:
    """The level the flags ask for: ``--log-level``, else ``-v`` (info), else the command's."""
    if (name := getattr(args, "log_level_name", None)) is not None:
        return int(getattr(logging, name.upper()))
    if getattr(args, "verbose", False):
        return logging.INFO
    return int(getattr(args, "log_level", logging.WARNING))
