"""``tidemq console``: serves the web console for a cluster (docs/console.md)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import re
import signal
import sys

from aiohttp import web

from tidemq._runtime import nameserver_addresses
from tidemq.admin import AsyncAdmin
from tidemq.cli.common import add_nameserver

log = logging.getLogger(__name__)

DESCRIPTION = "serve the web console: cluster, topics, groups, messages, DLQ, pending messages"
_LISTEN_RE = re.compile(r"(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):(?P<port>\d{1,5})\Z")


def parse_listen(text: str) -> tuple[str, int]:
    m = _LISTEN_RE.match(text)
    if m is None or not 0 <= int(m["port"]) <= 65535:
        raise ValueError(f"--listen {text!r} must be HOST:PORT (port 0-65535)")
    return m["host"].strip("[]") or "0.0.0.0", int(m["port"])


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``tidemq console`` (the ``tidemq.commands`` entry point)."""
    p = sub.add_parser("console", help=DESCRIPTION, description=DESCRIPTION)
    add_nameserver(p)
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="where to serve HTTP (default 127.0.0.1:8080; port 0 picks a free one)",
    )
    p.add_argument(
        "--sample-interval-s",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the console samples the cluster for its figures and charts (default 10)",
    )
    p.set_defaults(func=run, log_level=logging.INFO)


# Set by `tidemq dev` to its pid (services/dev.py, which the client layer may not import).
DIE_WITH_PARENT_ENV = "TIDEMQ_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1


def _exit_with_dev_parent() -> None:
    """A console started by ``tidemq dev`` ends when dev does, even by SIGKILL, instead of
    holding its port; Linux only (prctl)."""
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() != int(parent):  # it died before prctl took effect
        sys.exit(1)


def run(args: argparse.Namespace) -> int:
    _exit_with_dev_parent()
    # Here, not at the top: every `tidemq` command loads this module to list its flags, and
    # only the console needs the web server and templates.
    from tidemq.console.app import build_app  # noqa: PLC0415
    from tidemq.console.context import Console, ConsoleConfig  # noqa: PLC0415

    host, port = parse_listen(args.listen)
    nameserver = ",".join(nameserver_addresses(args.nameserver))
    config = ConsoleConfig(nameserver=nameserver, sample_interval_s=args.sample_interval_s)

    async def serve() -> None:
        console = Console(config, AsyncAdmin(nameserver))
        runner = web.AppRunner(build_app(console), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        # One line a script (and `tidemq dev`) can read the address from.
        print(f"tidemq console on http://{bound[0]}:{bound[1]}/ for {nameserver}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    return 0
