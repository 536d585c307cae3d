"""``tidemq send`` and ``tidemq consume``: a console producer and consumer. ``send`` can delay
delivery (``--delay``, ``--deliver-at``, ``--delay-level``; docs/production.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tidemq.cli.common import add_nameserver
from tidemq.cli.durations import parse_seconds
from tidemq.cli.times import format_time_ms, parse_time_ms
from tidemq.consumer import Consumer
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


def cmd_consume(args: argparse.Namespace) -> int:
    settings: dict[str, Any] = {
        "tags": args.tags,
        "start_from": args.start_from,
        "auto_commit": False,
        "mode": "broadcasting" if args.broadcast else "clustering",
    }
    received = 0
    with Consumer(args.nameserver, group=args.group, topic=args.topic, **settings) as consumer:
        idle_deadline = time.monotonic() + args.timeout
        while received < args.max and time.monotonic() < idle_deadline:
            wait = max(0.0, idle_deadline - time.monotonic())
            batch = consumer.poll(max_messages=min(256, args.max - received), timeout_s=wait)
            for m in batch:
                if args.json:
                    print(json.dumps(m.as_dict()), flush=True)
                else:
                    tag = f" tag={m.tag}" if m.tag else ""
                    keys = f" keys={','.join(m.keys)}" if m.keys else ""
                    body = m.body.decode(errors="replace")
                    print(
                        f"{m.topic}@{m.broker}#{m.queue_id} offset {m.queue_offset}"
                        f"{tag}{keys}: {body}",
                        flush=True,
                    )
            if batch:
                received += len(batch)
                idle_deadline = time.monotonic() + args.timeout
            elif consumer.last_error is not None and not consumer.last_error.retriable:
                # The consumer keeps trying in the background (a heartbeat, a pull); a command
                # that got nothing says why rather than exit 0 as if the topic were empty.
                raise consumer.last_error
        if not args.no_commit:
            consumer.commit()
    if not args.json:
        print(f"{received} message(s)", file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("send", help="send a message")
    s.add_argument("topic")
    s.add_argument("body")
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

    r = sub.add_parser("consume", help="read messages as a member of a consumer group")
    r.add_argument("topic")
    r.add_argument("--group", required=True)
    r.add_argument("--max", type=int, default=100, help="stop after this many messages")
    r.add_argument(
        "--timeout", type=float, default=5.0, help="stop after this many seconds without one"
    )
    r.add_argument("--tags", default="*", help="'*' or 'tagA || tagB'")
    r.add_argument(
        "--from",
        dest="start_from",
        choices=["first", "last"],
        default="first",
        help="where a new group starts (default first)",
    )
    r.add_argument("--broadcast", action="store_true", help="broadcasting mode")
    r.add_argument("--no-commit", action="store_true", help="do not commit offsets at the end")
    r.add_argument("--json", action="store_true", help="one JSON object per message")
    add_nameserver(r)
    r.set_defaults(func=cmd_consume)
