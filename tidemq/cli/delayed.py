"""``tidemq delayed list|cancel``: pending delayed messages (docs/production.md).

``list`` shows what waits, soonest first, with the recall handle each send returned; ``cancel``
recalls one by its topic and handle, so it is never delivered. Messages are sent delayed with
``tidemq send --delay 30s`` (or ``--deliver-at``, ``--delay-level``).
"""

from __future__ import annotations

import argparse
import json

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver
from tidemq.cli.listings import add_listing_options, check_limit, print_listing
from tidemq.cli.times import format_time_ms


def cmd_list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    with Admin(args.nameserver) as admin:
        listing = admin.list_delayed(args.topic, limit=args.limit)
    print_listing(
        listing.messages,
        listing.total,
        what=(
            f"pending delayed message(s) of {args.topic}"
            if args.topic
            else "pending delayed message(s)"
        ),
        json_key="messages",
        headers=("DELIVER_AT", "TOPIC", "BROKER", "QUEUE", "MSG_ID", "TAG", "RECALL_HANDLE"),
        row=lambda m: (
            format_time_ms(m.deliver_at_ms),
            m.topic,
            m.broker,
            m.queue_id,
            m.msg_id,
            m.tag,
            m.recall_handle,
        ),
        as_json=args.json,
    )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        msg_id = admin.recall(args.topic, args.recall_handle)
    if args.json:
        print(json.dumps({"topic": args.topic, "msg_id": msg_id, "recalled": True}))
    else:
        print(f"recalled {msg_id} of {args.topic}: it will not be delivered")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("delayed", help="pending delayed messages: list and cancel")
    dsub = d.add_subparsers(dest="delayed_command", required=True)
    ls = dsub.add_parser("list", help="pending delayed messages, soonest first")
    ls.add_argument("--topic", help="only this topic's (default: every topic)")
    add_listing_options(ls, "one JSON object: total and messages")
    ls.set_defaults(func=cmd_list)
    cancel = dsub.add_parser(
        "cancel", help="recall a pending delayed message: it is never delivered"
    )
    cancel.add_argument("topic")
    cancel.add_argument(
        "recall_handle", metavar="RECALL_HANDLE", help="as the send or `delayed list` showed it"
    )
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(func=cmd_cancel)
    for p in (ls, cancel):
        add_nameserver(p)
