"""``tidemq consume``: the console consumer, a member of a consumer group.

It reads until ``--max`` messages or ``--timeout`` seconds without one, or with ``--follow``
until Ctrl-C (or SIGTERM), committing after each batch so a restarted command carries on where
this one stopped. ``--from-offset``/``--from-time`` first move the group's committed offsets
(``Admin.reset_offsets``: every queue, or ``--queue``), as Kafka's console consumer's
``--offset``; other running members of the group commit their own positions over that.
``--save-bodies DIR`` writes each body to ``DIR/<msg id>``, as mqadmin's queryMsgById does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver
from tidemq.cli.positions import consume_start
from tidemq.consumer import Consumer
from tidemq.types import ReceivedMessage

POLL_BATCH = 256
# How long one poll waits in --follow mode: Ctrl-C is seen between polls at the latest.
FOLLOW_POLL_S = 1.0


def body_path(directory: str, msg_id: str) -> str:
    """Where ``--save-bodies`` writes a message's body: named by its id, which the broker makes
    of hex digits; anything else is replaced so an id never leaves the directory."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in msg_id).lstrip(".")
    return os.path.join(directory, safe or "_")


def save_body(directory: str, m: ReceivedMessage) -> str:
    path = body_path(directory, m.msg_id)
    with open(path, "wb") as f:
        f.write(m.body)
    return path


def _line(m: ReceivedMessage) -> str:
    tag = f" tag={m.tag}" if m.tag else ""
    keys = f" keys={','.join(m.keys)}" if m.keys else ""
    body = m.body.decode(errors="replace")
    return f"{m.topic}@{m.broker}#{m.queue_id} offset {m.queue_offset}{tag}{keys}: {body}"


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a container stopping, ``timeout``) ends --follow like Ctrl-C: commit, exit."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reset(args: argparse.Namespace) -> None:
    where = consume_start(args)
    if where is None:
        return
    with Admin(args.nameserver) as admin:
        moved = admin.reset_offsets(args.group, args.topic, **where)
    if not args.json:
        at = ", ".join(f"{q.broker}#{q.queue_id}@{q.committed_offset}" for q in moved)
        print(f"group {args.group} starts at {at}", file=sys.stderr)


def cmd_consume(args: argparse.Namespace) -> int:
    limit = args.max if args.max is not None else (None if args.follow else 100)
    if limit is not None and limit <= 0:
        raise ValueError("--max must be > 0")
    if args.save_bodies:
        os.makedirs(args.save_bodies, exist_ok=True)
    _reset(args)
    settings: dict[str, Any] = {
        "tags": args.tags,
        "start_from": args.start_from,
        "auto_commit": False,
        "mode": "broadcasting" if args.broadcast else "clustering",
    }
    received = 0
    announced = False
    with (
        _sigterm_as_interrupt(),
        Consumer(args.nameserver, group=args.group, topic=args.topic, **settings) as consumer,
    ):
        try:
            idle_deadline = time.monotonic() + args.timeout
            while limit is None or received < limit:
                if args.follow:
                    wait = FOLLOW_POLL_S
                else:
                    wait = idle_deadline - time.monotonic()
                    if wait <= 0:
                        break
                want = POLL_BATCH if limit is None else min(POLL_BATCH, limit - received)
                batch = consumer.poll(max_messages=want, timeout_s=wait)
                if args.follow and not announced and consumer.assignment():
                    # From here on, whatever is sent to its queues is shown: a script (or a
                    # person) tailing the topic knows when to start producing.
                    n = len(consumer.assignment())
                    print(f"following {args.topic} on {n} queue(s)", file=sys.stderr, flush=True)
                    announced = True
                for m in batch:
                    _show(m, args)
                if batch:
                    received += len(batch)
                    idle_deadline = time.monotonic() + args.timeout
                    if args.follow and not args.no_commit:
                        consumer.commit()
                elif consumer.last_error is not None and not consumer.last_error.retriable:
                    # The consumer keeps trying in the background (a heartbeat, a pull); a
                    # command that got nothing says why rather than exit 0 as if it were empty.
                    raise consumer.last_error
        except KeyboardInterrupt:
            if not args.follow:
                raise
        finally:
            if not args.no_commit:
                consumer.commit()
    if not args.json:
        print(f"{received} message(s)", file=sys.stderr)
    return 0


def _show(m: ReceivedMessage, args: argparse.Namespace) -> None:
    saved = save_body(args.save_bodies, m) if args.save_bodies else None
    if args.json:
        out = m.as_dict()
        if saved is not None:
            out["saved_to"] = saved
        print(json.dumps(out), flush=True)
    else:
        print(_line(m) + (f" (saved to {saved})" if saved else ""), flush=True)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser(
        "consume",
        help="read messages as a member of a consumer group",
        description="The console consumer: prints each message, commits the group's offsets. "
        "Stops after --max messages or --timeout seconds without one; --follow reads until "
        "Ctrl-C.",
    )
    r.add_argument("topic")
    r.add_argument("--group", required=True)
    r.add_argument(
        "--max", type=int, help="stop after this many messages (default 100; --follow: none)"
    )
    r.add_argument(
        "--timeout", type=float, default=5.0, help="stop after this many seconds without one"
    )
    r.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep reading until Ctrl-C, committing after each batch (unless --no-commit)",
    )
    r.add_argument("--tags", default="*", help="'*' or 'tagA || tagB'")
    r.add_argument(
        "--from",
        dest="start_from",
        choices=["first", "last"],
        default="first",
        help="where a queue new to the group starts (default first)",
    )
    start = r.add_argument_group(
        "starting position (moves the group's committed offsets first, as consumer-group reset)"
    )
    start.add_argument(
        "--from-offset", type=int, metavar="N", help="start every queue (or --queue) at offset N"
    )
    start.add_argument(
        "--from-time",
        metavar="TIME",
        help="start at the first message stored at or after TIME (ISO 8601 or ms since epoch)",
    )
    start.add_argument("--queue", type=int, metavar="Q", help="move only this queue id")
    start.add_argument("--broker", metavar="NAME", help="only this broker group's queues")
    r.add_argument("--broadcast", action="store_true", help="broadcasting mode")
    r.add_argument("--no-commit", action="store_true", help="do not commit offsets")
    r.add_argument("--json", action="store_true", help="one JSON object per message")
    r.add_argument(
        "--save-bodies",
        metavar="DIR",
        help="also write each message's body to DIR/<msg id> (the directory is created)",
    )
    add_nameserver(r)
    r.set_defaults(func=cmd_consume)
