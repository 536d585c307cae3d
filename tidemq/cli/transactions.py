"""``tidemq transactions list``: open transactions (docs/production.md), the half messages
neither committed nor rolled back yet, oldest first, with how often the broker checked back
with their producer group."""

from __future__ import annotations

import argparse

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver
from tidemq.cli.listings import add_listing_options, check_limit, print_listing
from tidemq.cli.times import format_time_ms


def cmd_list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    with Admin(args.nameserver) as admin:
        listing = admin.list_transactions(args.group, limit=args.limit)
    print_listing(
        listing.transactions,
        listing.total,
        what=f"open transaction(s) of {args.group}" if args.group else "open transaction(s)",
        json_key="transactions",
        headers=(
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
        row=lambda t: (
            format_time_ms(t.stored_at_ms),
            t.producer_group,
            t.topic,
            t.broker,
            t.queue_id,
            t.checks,
            None if t.last_check_ms is None else format_time_ms(t.last_check_ms),
            t.msg_id,
            t.transaction_id,
        ),
        as_json=args.json,
    )
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser("transactions", help="open transactions (half messages)")
    tsub = t.add_subparsers(dest="transactions_command", required=True)
    ls = tsub.add_parser("list", help="open transactions, oldest first")
    ls.add_argument("--group", help="only this producer group's (default: every group)")
    add_listing_options(ls, "one JSON object: total and transactions")
    ls.set_defaults(func=cmd_list)
    add_nameserver(ls)
