"""``tidemq message show|find|history``: one message by id (body and properties), a topic's
messages by key or by time range, and a message's life: stored, delivered to whom and how often,
acked or dead-lettered (docs/consumption.md, "A message's life")."""

from __future__ import annotations

import argparse
import json

from tidemq.admin import Admin
from tidemq.admin.message_history import MessageEvent, MessageHistory
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.tables import print_table
from tidemq.cli.times import format_time_ms, parse_time_ms
from tidemq.types import ReceivedMessage


def _body_text(body: bytes, width: int | None = None) -> str:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        text = "0x" + body.hex()
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


def _time(ms: int | None) -> str | None:
    return format_time_ms(ms) if ms else None


def print_message(m: ReceivedMessage) -> None:
    rows: list[tuple[str, str | int | None]] = [
        ("msg_id", m.msg_id),
        ("topic", m.topic),
        ("broker", m.broker),
        ("queue", m.queue_id),
        ("offset", m.queue_offset),
        ("tag", m.tag),
        ("keys", " ".join(m.keys) or None),
        ("stored", _time(m.store_timestamp_ms)),
        ("store host", m.store_host or None),
        ("born", _time(m.born_timestamp_ms)),
        ("born host", m.born_host or None),
        ("reconsume times", m.reconsume_times),
        ("size", len(m.body)),
    ]
    rows += [(f"property {k}", v) for k, v in sorted(m.properties.items())]
    print_table(("FIELD", "VALUE"), rows)
    print()
    print(_body_text(m.body))


def cmd_show(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        m = admin.view_message(args.msg_id)
    if args.save_body:
        # The body exactly as stored (binary safe), as mqadmin queryMsgById writes it to a file.
        with open(args.save_body, "wb") as f:
            f.write(m.body)
    if args.json:
        print_json(m.as_dict())
    else:
        print_message(m)
    return 0


def cmd_find(args: argparse.Namespace) -> int:
    since = parse_time_ms(args.since) if args.since else None
    until = parse_time_ms(args.until) if args.until else None
    if args.key is None and since is None and until is None:
        raise ValueError("give --key, or a time range with --since and/or --until")
    with Admin(args.nameserver) as admin:
        found = admin.find_messages(
            args.topic, key=args.key, begin_ms=since, end_ms=until, limit=args.limit
        )
    if args.json:
        for m in found:
            print(json.dumps(m.as_dict()))
        return 0
    if not found:
        print("no messages found")
        return 0
    print_table(
        ("STORED", "MSG_ID", "BROKER", "QUEUE", "OFFSET", "TAG", "KEYS", "BODY"),
        [
            (
                _time(m.store_timestamp_ms),
                m.msg_id,
                m.broker,
                m.queue_id,
                m.queue_offset,
                m.tag,
                " ".join(m.keys) or None,
                _body_text(m.body, 40),
            )
            for m in found
        ],
    )
    return 0


def history_rows(h: MessageHistory) -> list[tuple[str | int | None, ...]]:
    def row(e: MessageEvent) -> tuple[str | int | None, ...]:
        return (
            _time(e.time_ms) or "(not recorded)",
            e.kind.value,
            e.group,
            e.client_id,
            e.attempt,
            _time(e.invisible_until_ms),
            e.detail,
        )

    return [row(e) for e in h.events]


def cmd_history(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        h = admin.message_history(args.msg_id)
    if args.json:
        print_json(h.as_dict())
        return 0
    m = h.message
    print(f"{m.msg_id}  {m.topic}  {m.broker} queue {m.queue_id} offset {m.queue_offset}")
    print()
    print_table(
        ("TIME", "EVENT", "GROUP", "CLIENT", "ATTEMPT", "INVISIBLE_UNTIL", "DETAIL"),
        history_rows(h),
    )
    if h.groups:
        print()
        print_table(
            ("GROUP", "MODEL", "STATE", "DELIVERIES", "COMMITTED_OFFSET"),
            [(g.group, g.model, g.state, g.deliveries, g.committed_offset) for g in h.groups],
        )
    for note in h.notes:
        print(f"note: {note}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("message", help="look messages up: by id, key or time; their history")
    msub = p.add_subparsers(dest="message_command", required=True)
    show = msub.add_parser("show", help="one message: where, when, properties and body")
    show.add_argument("msg_id", metavar="MSG_ID")
    show.add_argument("--save-body", metavar="PATH", help="also write the body to PATH, as is")
    show.set_defaults(func=cmd_show)
    find = msub.add_parser("find", help="a topic's messages by key or by time range")
    find.add_argument("topic")
    find.add_argument("--key", help="messages carrying this key")
    find.add_argument("--since", help="stored at or after (ISO 8601 or ms since the epoch)")
    find.add_argument("--until", help="stored before (ISO 8601 or ms since the epoch)")
    find.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    find.set_defaults(func=cmd_find)
    history = msub.add_parser(
        "history", help="a message's life: stored, delivered to whom, acked or dead-lettered"
    )
    history.add_argument("msg_id", metavar="MSG_ID")
    history.set_defaults(func=cmd_history)
    for c in (show, find, history):
        c.add_argument("--json", action="store_true", help="JSON instead of tables")
        add_nameserver(c)
