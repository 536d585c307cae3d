"""``tidemq consumer-group reset``: move a group's committed offsets on a topic (mqadmin's
resetOffsetByTime, Kafka's ``kafka-consumer-groups --reset-offsets``) to the first or last
message, a time, or an explicit offset of every queue or of one queue."""

from __future__ import annotations

import argparse

from tidemq.admin import Admin
from tidemq.cli.common import print_json
from tidemq.cli.positions import reset_arguments
from tidemq.cli.tables import print_table


def cmd_reset(args: argparse.Namespace) -> int:
    where = reset_arguments(to=args.to, offset=args.offset, queue=args.queue, broker=args.broker)
    with Admin(args.nameserver) as admin:
        moved = admin.reset_offsets(args.group, args.topic, **where)
    rows = [
        {
            "broker": q.broker,
            "queue_id": q.queue_id,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
            "committed_offset": q.committed_offset,
            "lag": q.lag,
        }
        for q in moved
    ]
    if args.json:
        print_json({"group": args.group, "topic": args.topic, "queues": rows})
        return 0
    print(f"consumer group {args.group} on {args.topic}: {len(rows)} queue(s) moved")
    print_table(
        ("BROKER", "QUEUE", "MIN", "MAX", "COMMITTED", "LAG"),
        [tuple(r.values()) for r in rows],
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    r: argparse.ArgumentParser = sub.add_parser(
        "reset",
        help="move the group's committed offsets on a topic (stop its consumers first)",
        description="Move the group's committed offsets: --to first|last|TIME, or --offset N "
        "(kept within each queue's range), for every queue or only --queue. Running members "
        "commit their own positions over this: stop them first.",
    )
    r.add_argument("group")
    r.add_argument("--topic", required=True)
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument(
        "--to",
        metavar="first|last|TIME",
        help="the first or last message, or the first stored at or after TIME "
        "(ISO 8601; a bare number is ms since the epoch)",
    )
    to.add_argument("--offset", type=int, metavar="N", help="this offset")
    r.add_argument("--queue", type=int, metavar="Q", help="only this queue id")
    r.add_argument("--broker", metavar="NAME", help="only this broker group's queues")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_reset)
    return r
