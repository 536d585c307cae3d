"""``tidemq send`` and ``tidemq consume``: a console producer and consumer."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tidemq.cli.common import add_nameserver
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


def cmd_send(args: argparse.Namespace) -> int:
    props = _properties(args.property)
    with Producer(args.nameserver) as producer:
        futures = [
            producer.send_async(
                args.topic,
                args.body,
                tag=args.tag,
                keys=args.key,
                properties=props,
                message_group=args.message_group,
            )
            for _ in range(args.count)
        ]
        results = [f.result() for f in futures]
    for r in results:
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
                    }
                )
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
