"""``tidemq dlq list|resend``: a consumer group's dead-letter queue (``%DLQ%<group>``).

A message that used up its delivery attempts (or was dead-lettered on purpose) is copied there
with its original topic, message id, attempts and reason in properties. ``list`` shows them;
``resend`` sends a message back to its original topic as a new message (docs/consumption.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.listings import add_listing_options, check_limit
from tidemq.cli.tables import print_table
from tidemq.errors import TidemqError
from tidemq.types import ReceivedMessage, SendResult

# Property names of a dead-letter copy (RocketMQ's RETRY_TOPIC, and ours).
ORIGIN_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
ATTEMPTS = "DLQ_DELIVERY_ATTEMPTS"
REASON = "DLQ_REASON"
TIME_MS = "DLQ_TIME_MS"


def dead_letter_json(m: ReceivedMessage) -> dict[str, Any]:
    p = m.properties
    return {
        **m.as_dict(),
        "origin_topic": p.get(ORIGIN_TOPIC),
        "origin_msg_id": p.get(ORIGIN_MESSAGE_ID),
        "delivery_attempts": int(p[ATTEMPTS]) if p.get(ATTEMPTS, "").isdigit() else None,
        "reason": p.get(REASON),
        "dead_lettered_ms": int(p[TIME_MS]) if p.get(TIME_MS, "").isdigit() else None,
    }


def cmd_list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    with Admin(args.nameserver) as admin:
        messages = [dead_letter_json(m) for m in admin.dead_letters(args.group, limit=args.limit)]
    if args.json:
        for m in messages:
            print(json.dumps(m))
        return 0
    if not messages:
        print(f"the dead-letter queue of {args.group} is empty")
        return 0
    print_table(
        ("MSG_ID", "TOPIC", "ATTEMPTS", "REASON", "BODY"),
        [
            (
                m["msg_id"],
                m["origin_topic"],
                m["delivery_attempts"],
                m["reason"],
                _short(m["body"] if m["body_encoding"] == "utf-8" else "<binary>"),
            )
            for m in messages
        ],
    )
    return 0


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _result_json(msg_id: str, r: SendResult) -> dict[str, Any]:
    return {
        "dlq_msg_id": msg_id,
        "status": r.status.value,
        "msg_id": r.msg_id,
        "topic": r.topic,
        "broker": r.broker,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
    }


def cmd_resend(args: argparse.Namespace) -> int:
    if bool(args.msg_ids) == args.all:
        raise ValueError("give the message ids to resend, or --all")
    failed = 0
    with Admin(args.nameserver) as admin:
        ids = args.msg_ids
        if args.all:
            ids = [m.msg_id for m in admin.dead_letters(args.group, limit=args.limit)]
        results = []
        for msg_id in ids:
            try:
                results.append(_result_json(msg_id, admin.resend_dead_letter(args.group, msg_id)))
            except TidemqError as e:
                print(f"tidemq: {e}", file=sys.stderr)
                failed += 1
    if args.json:
        print_json(results)
    else:
        for r in results:
            print(
                f"{r['dlq_msg_id']} -> {r['status']} {r['msg_id']} "
                f"{r['topic']}@{r['broker']}#{r['queue_id']} offset {r['queue_offset']}"
            )
        if args.all and not ids:
            print(f"the dead-letter queue of {args.group} is empty", file=sys.stderr)
    return 1 if failed else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("dlq", help="a consumer group's dead-letter queue: list and resend")
    dsub = d.add_subparsers(dest="dlq_command", required=True)
    ls = dsub.add_parser("list", help="messages in %%DLQ%%<group>, oldest first")
    ls.add_argument("group", help="consumer group")
    add_listing_options(ls, "one JSON object per message")
    ls.set_defaults(func=cmd_list)
    rs = dsub.add_parser("resend", help="send dead-lettered messages back to their topic")
    rs.add_argument("group", help="consumer group")
    rs.add_argument("msg_ids", nargs="*", metavar="MSG_ID", help="as `dlq list` shows them")
    rs.add_argument("--all", action="store_true", help="every message `dlq list` would show")
    rs.add_argument("--limit", type=int, default=100, help="with --all: at most this many")
    rs.add_argument("--json", action="store_true")
    rs.set_defaults(func=cmd_resend)
    for p in (ls, rs):
        add_nameserver(p)
