"""``tidemq receive``: receive/ack consumption from the shell (a ``SimpleConsumer``).

Each message received is printed, then acked (default), nacked (``--nack``: retried after the
group's backoff), moved to the dead-letter queue (``--dead-letter REASON``) or left alone
(``--no-ack``: delivered again when its invisible time ends). It stops after ``--count``
messages or ``--timeout`` seconds without one. A handle the broker refuses (expired, already
acked) is reported on stderr, one line each, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import tidemq
from tidemq.cli.common import add_nameserver
from tidemq.cli.durations import parse_seconds
from tidemq.errors import TidemqError
from tidemq.types import ReceivedMessage

# Messages asked for per receive: few enough that a slow terminal does not let their invisible
# time run out before they are acked.
RECEIVE_BATCH = 32


def _settle(consumer: Any, m: ReceivedMessage, args: argparse.Namespace) -> str:
    """Acts on one message as the flags say; returns what was done."""
    if args.no_ack:
        return "left"
    if args.nack:
        consumer.nack(m)
        return "nacked"
    if args.dead_letter is not None:
        consumer.dead_letter(m, reason=args.dead_letter)
        return "dead-lettered"
    consumer.ack(m)
    return "acked"


def _line(m: ReceivedMessage, outcome: str) -> str:
    tag = f" tag={m.tag}" if m.tag else ""
    keys = f" keys={','.join(m.keys)}" if m.keys else ""
    group = f" message_group={m.message_group}" if m.message_group else ""
    body = m.body.decode(errors="replace").replace("\n", "\\n")
    return (
        f"{m.topic}@{m.broker}#{m.queue_id} offset {m.queue_offset} "
        f"attempt {m.delivery_attempt} {outcome}{tag}{keys}{group}: {body}"
    )


def cmd_receive(args: argparse.Namespace) -> int:
    if args.count <= 0:
        raise ValueError("--count must be > 0")
    if not math.isfinite(args.timeout) or args.timeout < 0:
        raise ValueError("--timeout must be a number of seconds >= 0")
    invisible_s = parse_seconds(args.invisible)
    start_from: str | int = args.start_from
    if args.start_from not in ("first", "last"):
        if not args.start_from.isdigit():
            raise ValueError("--from takes first, last or a timestamp in ms")
        start_from = int(args.start_from)
    config = tidemq.SimpleConsumerConfig(start_from=start_from)
    received, failed = 0, 0
    counts: dict[str, int] = {}
    with tidemq.SimpleConsumer(
        args.group, {args.topic: args.tags}, nameserver=args.nameserver, config=config
    ) as consumer:
        idle_deadline = time.monotonic() + args.timeout
        while received < args.count:
            wait = idle_deadline - time.monotonic()
            if wait <= 0:
                break
            batch = consumer.receive(
                max_messages=min(RECEIVE_BATCH, args.count - received),
                invisible_duration_s=invisible_s,
                timeout_s=wait,
            )
            for m in batch:
                try:
                    outcome = _settle(consumer, m, args)
                except TidemqError as e:
                    print(f"tidemq: {e}", file=sys.stderr)
                    failed += 1
                    outcome = "failed"
                counts[outcome] = counts.get(outcome, 0) + 1
                if args.json:
                    print(json.dumps({**m.as_dict(), "outcome": outcome}), flush=True)
                else:
                    print(_line(m, outcome), flush=True)
            if batch:
                received += len(batch)
                idle_deadline = time.monotonic() + args.timeout
    if not args.json:
        done = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        print(f"{received} message(s){': ' + done if done else ''}", file=sys.stderr)
    return 1 if failed else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser(
        "receive",
        help="receive messages as a member of a receive/ack consumer group, and ack them",
        description="Receive messages, print them and ack them (or --nack, --dead-letter, "
        "--no-ack). The group uses the receive/ack model (docs/consumption.md).",
    )
    r.add_argument("topic")
    r.add_argument("--group", required=True, help="consumer group")
    r.add_argument("--count", type=int, default=100, help="stop after this many messages")
    r.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="stop after this many seconds without a message (default 5)",
    )
    r.add_argument("--tags", default="*", help="'*' or 'tagA || tagB'")
    r.add_argument(
        "--invisible",
        default="30s",
        metavar="DURATION",
        help="invisible time of each message received (default 30s; e.g. 500ms, 2m)",
    )
    r.add_argument(
        "--from",
        dest="start_from",
        default="first",
        metavar="first|last|MS",
        help="where a queue the group never received from starts (default first)",
    )
    what = r.add_mutually_exclusive_group()
    what.add_argument(
        "--nack", action="store_true", help="give each message back: retried after the backoff"
    )
    what.add_argument(
        "--dead-letter",
        metavar="REASON",
        help="move each message to the group's dead-letter queue with this reason",
    )
    what.add_argument(
        "--no-ack",
        action="store_true",
        help="neither ack nor nack: delivered again when the invisible time ends",
    )
    r.add_argument("--json", action="store_true", help="one JSON object per message")
    add_nameserver(r)
    r.set_defaults(func=cmd_receive)
