"""``tidemq transactions list``: open transactions (docs/production.md), the half messages
neither committed nor rolled back yet, oldest first, with how often the broker checked back
with their producer group."""

from __future__ import annotations

import argparse
import sys

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.tables import print_table
from tidemq.cli.times import format_time_ms


def cmd_list(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise ValueError("--limit must be > 0")
    with Admin(args.nameserver) as admin:
        listing = admin.list_transactions(args.group, limit=args.limit)
    if args.json:
        print_json(
            {"total": listing.total, "transactions": [t.as_dict() for t in listing.transactions]}
        )
        return 0
    what = f"open transaction(s) of {args.group}" if args.group else "open transaction(s)"
    if not listing.transactions:
        print(f"no {what}")
        return 0
    print_table(
        (
            "STORED_AT",
            "PRODUCER_GROUP",
            "TOPIC",
            "BROKER",
            "QUEUE",
            "CHECKS",
            "LAST_CHECK",
            "MSG_ID",
            "TRANSACTION_ID",
        ),
        [
            (
                format_time_ms(t.stored_at_ms),
                t.producer_group,
                t.topic,
                t.broker,
                t.queue_id,
                t.checks,
                None if t.last_check_ms is None else format_time_ms(t.last_check_ms),
                t.msg_id,
                t.transaction_id,
            )
            for t in listing.transactions
        ],
    )
    print(f"{len(listing.transactions)} of {listing.total} {what}", file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser("transactions", help="open transactions (half messages)")
    tsub = t.add_subparsers(dest="transactions_command", required=True)
    ls = tsub.add_parser("list", help="open transactions, oldest first")
    ls.add_argument("--group", help="only this producer group's (default: every group)")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--json", action="store_true", help="one JSON object: total and transactions")
    ls.set_defaults(func=cmd_list)
    add_nameserver(ls)
