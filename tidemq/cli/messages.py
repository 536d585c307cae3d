"""``tidemq send`` and ``tidemq consume``: a console producer and consumer. ``send`` can delay
delivery (``--delay``, ``--deliver-at``, ``--delay-level``; docs/production.md); without a body
it reads messages from stdin or ``--file`` (``console_send``). ``consume`` is in
``console_consume``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tidemq.cli import console_consume
from tidemq.cli.common import add_nameserver
from tidemq.cli.console_input import LineDefaults
from tidemq.cli.console_send import send_lines
from tidemq.cli.durations import parse_seconds
from tidemq.cli.times import format_time_ms, parse_time_ms
from tidemq.producer import Producer


def _properties(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--property {item!r} must be NAME=VALUE")
        out[name] = value
    return out


# RocketMQ 4's delay levels (1s 5s 10s 30s 1m ... 2h).
DELAY_LEVELS = range(1, 19)


def send_timing(args: argparse.Namespace) -> dict[str, Any]:
    """The producer's delay options the flags ask for (none: deliver at once); ValueError for
    a bad one, before anything is sent."""
    if args.delay is not None:
        return {"delay": parse_seconds(args.delay)}
    if args.deliver_at is not None:
        return {"deliver_at": parse_time_ms(args.deliver_at)}
    if args.delay_level is not None:
        if args.delay_level not in DELAY_LEVELS:
            raise ValueError(f"--delay-level {args.delay_level}: a level is 1..18")
        return {"delay_level": args.delay_level}
    return {}


def cmd_send(args: argparse.Namespace) -> int:
    props = _properties(args.property)
    timing = send_timing(args)
    if args.body is None:
        if args.count != 1:
            raise ValueError("--count goes with a BODY argument, not with lines from stdin/--file")
        defaults = LineDefaults(args.tag, tuple(args.key), props, args.message_group)
        return send_lines(args, defaults, timing)
    if args.file is not None or args.json_lines:
        raise ValueError("give a BODY argument or --file/--json-lines, not both")
    with Producer(args.nameserver) as producer:
        futures = [
            producer.send_async(
                args.topic,
                args.body,
                tag=args.tag,
                keys=args.key,
                properties=props,
                message_group=args.message_group,
                **timing,
            )
            for _ in range(args.count)
        ]
        results = [f.result() for f in futures]
    for r in results:
        delayed = {"deliver_at_ms": r.deliver_at_ms, "recall_handle": r.recall_handle}
        if args.json:
            print(
                json.dumps(
                    {
                        "status": r.status.value,
                        "msg_id": r.msg_id,
                        "topic": r.topic,
                        "broker": r.broker,
                        "queue_id": r.queue_id,
                        "queue_offset": r.queue_offset,
                        **(delayed if r.recall_handle else {}),
                    }
                )
            )
        elif r.recall_handle:
            # Waiting in the broker's timer, not in the topic yet: no queue offset to show.
            print(
                f"{r.status.value} {r.msg_id} {r.topic}@{r.broker} delayed until "
                f"{format_time_ms(r.deliver_at_ms)} recall handle {r.recall_handle}"
            )
        else:
            print(
                f"{r.status.value} {r.msg_id} {r.topic}@{r.broker}#{r.queue_id} "
                f"offset {r.queue_offset}"
            )
    return 0 if all(r.ok for r in results) else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser(
        "send",
        help="send a message, or one per line of stdin/--file",
        description="Send BODY, or without BODY one message per line of stdin (or --file); "
        "with --json-lines each line is a JSON object: body or body_base64, keys, tag, "
        "properties, message_group, delay. The flags below are every line's defaults.",
    )
    s.add_argument("topic")
    s.add_argument("body", nargs="?", help="the message (omit it to read lines)")
    s.add_argument("--file", metavar="PATH", help="read the lines from PATH instead of stdin")
    s.add_argument(
        "--json-lines",
        action="store_true",
        help="each line is a JSON object (body/body_base64, keys, tag, properties, "
        "message_group, delay)",
    )
    s.add_argument("--tag")
    s.add_argument("--key", action="append", default=[], help="a message key (repeatable)")
    s.add_argument(
        "--property", action="append", default=[], metavar="NAME=VALUE", help="(repeatable)"
    )
    s.add_argument(
        "--message-group",
        "--sharding-key",
        dest="message_group",
        metavar="NAME",
        help="one message group, one queue: ordered per group (FIFO receive groups)",
    )
    when = s.add_mutually_exclusive_group()
    when.add_argument(
        "--delay", metavar="DURATION", help="deliver after this long (500ms, 30s, 2m, 1h, 3d)"
    )
    when.add_argument(
        "--deliver-at",
        metavar="TIME",
        help="deliver at this time: ISO 8601 (no zone: local time) or ms since the epoch",
    )
    when.add_argument(
        "--delay-level",
        type=int,
        metavar="N",
        help="RocketMQ 4's delay level 1..18 (1s 5s 10s 30s 1m 2m ... 10m 20m 30m 1h 2h)",
    )
    s.add_argument("--count", type=int, default=1, help="send the message this many times")
    s.add_argument("--json", action="store_true", help="one JSON object per result")
    add_nameserver(s)
    s.set_defaults(func=cmd_send)

    console_consume.add_parser(sub)
