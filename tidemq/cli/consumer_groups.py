"""``tidemq consumer-group list|describe|update|reset|delete``: consumer groups, their progress.

A consumer group is the set of consumers that share a topic's messages (RocketMQ's subscription
group); its settings (model, max delivery attempts, retry policy, FIFO, consume enabled) live on
the brokers. ``describe`` shows, per queue, how far the group is: for a receive/ack group what
is done, in flight, waiting for a retry and held back behind a FIFO message group; for an
offsets group its committed offset. See docs/consumption.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from tidemq.admin import Admin, RetryPolicy
from tidemq.cli import group_reset
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.durations import format_ms, parse_seconds, parse_seconds_list
from tidemq.cli.group_views import group_json, offsets_rows, receive_rows
from tidemq.cli.tables import print_rows, print_table
from tidemq.errors import NotFoundError, TidemqError

MODELS = ("offsets", "receive")
# (header, key) of the per-queue tables of `describe`.
RECEIVE_COLUMNS = (
    ("TOPIC", "topic"),
    ("BROKER", "broker"),
    ("QUEUE", "queue_id"),
    ("DONE", "done_offset"),
    ("NEXT", "next_offset"),
    ("MAX", "max_offset"),
    ("INFLIGHT", "inflight"),
    ("RETRYING", "retrying"),
    ("BLOCKED", "blocked"),
    ("LAG", "lag"),
)
OFFSETS_COLUMNS = (
    ("TOPIC", "topic"),
    ("BROKER", "broker"),
    ("QUEUE", "queue_id"),
    ("MIN", "min_offset"),
    ("MAX", "max_offset"),
    ("COMMITTED", "committed_offset"),
    ("LAG", "lag"),
)


def _retry_text(policy: dict[str, Any]) -> str:
    if policy["delays_ms"]:
        return " ".join(format_ms(d) for d in policy["delays_ms"])
    return (
        f"exponential from {format_ms(policy['initial_ms'])} x{policy['multiplier']:g} "
        f"up to {format_ms(policy['max_ms'])}"
    )


def _true_or_false(text: str) -> bool:
    value = {"true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r}: true or false")
    return value


def cmd_list(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        groups = [group_json(g) for g in admin.list_consumer_groups()]
    groups.sort(key=lambda g: g["group"])
    if args.json:
        print_json(groups)
        return 0
    if not groups:
        print("no consumer groups")
        return 0
    print_table(
        ("GROUP", "MODEL", "FIFO", "ENABLED", "ATTEMPTS", "TOPICS"),
        [
            (
                g["group"],
                g["model"],
                g["fifo"],
                g["consume_enabled"],
                g["max_delivery_attempts"],
                ",".join(g["topics"]) or None,
            )
            for g in groups
        ],
    )
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        group = group_json(admin.get_consumer_group(args.group))
        topics = [args.topic] if args.topic else group["topics"]
        group["members"] = _members(admin, args.group, topics)
        if group["model"] == "receive":
            state = admin.receive_state(args.group, args.topic)
            queues: dict[str, Any] = {
                "receive": receive_rows(state),
                "dead_letters": state.dead_letters,
            }
        else:
            queues = {
                "offsets": offsets_rows(
                    {t: admin.queue_status(t, args.group) for t in sorted(topics)}
                )
            }
    if args.json:
        print_json({**group, **queues})
        return 0
    print(f"consumer group {group['group']}")
    print(
        f"  model {group['model'] or 'not used yet'}, fifo {'on' if group['fifo'] else 'off'}, "
        f"consume {'enabled' if group['consume_enabled'] else 'DISABLED'}, "
        f"max delivery attempts {group['max_delivery_attempts']}"
    )
    print(f"  retry delays: {_retry_text(group['retry_policy'])}")
    print(f"  topics: {', '.join(group['topics']) or '-'}")
    print(f"  members: {', '.join(group['members']) or 'none connected'}")
    if "receive" in queues:
        print(f"  dead letters: {queues['dead_letters']}")
        print_rows(RECEIVE_COLUMNS, queues["receive"])
    else:
        print_rows(OFFSETS_COLUMNS, queues["offsets"])
    return 0


def _members(admin: Admin, group: str, topics: list[str]) -> list[str]:
    """The clients connected as the group's members (RocketMQ's consumerConnection); a topic
    deleted since the group used it has none to ask about."""
    members: set[str] = set()
    for topic in topics:
        try:
            members.update(admin.group_members(group, topic))
        except TidemqError:
            continue
    return sorted(members)


def update_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The Admin.update_consumer_group arguments the flags ask for (ValueError: none, or a
    contradiction)."""
    changes: dict[str, Any] = {}
    if args.max_delivery_attempts is not None:
        changes["max_delivery_attempts"] = args.max_delivery_attempts
    exponential = [args.retry_initial, args.retry_max, args.retry_multiplier]
    retry_ways = sum(
        (args.retry_delays is not None, any(x is not None for x in exponential), args.retry_default)
    )
    if retry_ways > 1:
        raise ValueError(
            "give one retry policy: --retry-delays, or --retry-initial/--retry-max/"
            "--retry-multiplier, or --retry-default"
        )
    if args.retry_delays is not None:
        changes["retry_delays_s"] = parse_seconds_list(args.retry_delays)
    elif any(x is not None for x in exponential):
        changes["retry_policy"] = RetryPolicy.exponential(
            initial_ms=round(parse_seconds(args.retry_initial or "1s") * 1000),
            max_ms=round(parse_seconds(args.retry_max or "2h") * 1000),
            multiplier=2.0 if args.retry_multiplier is None else args.retry_multiplier,
        )
    elif args.retry_default:
        changes["retry_policy"] = RetryPolicy()
    if args.fifo is not None:
        changes["fifo"] = args.fifo
    if args.consume_enabled is not None:
        changes["consume_enabled"] = args.consume_enabled
    if args.model is not None:
        changes["model"] = args.model
    if not changes:
        raise ValueError("nothing to change: give at least one setting (see --help)")
    return changes


def cmd_update(args: argparse.Namespace) -> int:
    changes = update_kwargs(args)
    with Admin(args.nameserver) as admin:
        group = group_json(admin.update_consumer_group(args.group, **changes))
    if args.json:
        print_json(group)
        return 0
    print(
        f"consumer group {group['group']}: model {group['model'] or 'not used yet'}, "
        f"fifo {'on' if group['fifo'] else 'off'}, "
        f"consume {'enabled' if group['consume_enabled'] else 'DISABLED'}, "
        f"max delivery attempts {group['max_delivery_attempts']}, "
        f"retry delays: {_retry_text(group['retry_policy'])}"
    )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        brokers = admin.delete_consumer_group(args.group)
    if not brokers:
        raise NotFoundError(
            f"consumer group {args.group!r} not found on any master", code="GROUP_NOT_FOUND"
        )
    print(f"consumer group {args.group} deleted from {', '.join(brokers)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cg = sub.add_parser(
        "consumer-group", help="consumer groups: settings, model, progress per queue"
    )
    cgsub = cg.add_subparsers(dest="consumer_group_command", required=True)
    ls = cgsub.add_parser("list", help="every consumer group the masters know")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    d = cgsub.add_parser(
        "describe",
        help="settings, members, and per queue: committed/done, in flight, retrying, lag",
    )
    d.add_argument("group")
    d.add_argument("--topic", help="only this topic")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_describe)

    u = cgsub.add_parser("update", help="change settings (a group that does not exist is created)")
    u.add_argument("group")
    u.add_argument(
        "--max-delivery-attempts",
        type=int,
        metavar="N",
        help="deliveries before the dead-letter queue (1-1000, default 16)",
    )
    u.add_argument(
        "--retry-delays",
        metavar="D1,D2,...",
        help="wait after each failed delivery, e.g. 1s,5s,30s,2m (the last repeats)",
    )
    u.add_argument("--retry-initial", metavar="DURATION", help="exponential backoff: first wait")
    u.add_argument("--retry-max", metavar="DURATION", help="exponential backoff: longest wait")
    u.add_argument(
        "--retry-multiplier", type=float, metavar="X", help="exponential backoff: factor (>= 1)"
    )
    u.add_argument(
        "--retry-default", action="store_true", help="back to the default delays (1s ... 2h)"
    )
    fifo = u.add_mutually_exclusive_group()
    fifo.add_argument(
        "--fifo", dest="fifo", action="store_const", const=True, help="order by message group"
    )
    fifo.add_argument("--no-fifo", dest="fifo", action="store_const", const=False)
    enabled = u.add_mutually_exclusive_group()
    enabled.add_argument(
        "--consume-enabled",
        type=_true_or_false,
        metavar="true|false",
        help="false pauses the group (receives answer CONSUME_DISABLED); true resumes it",
    )
    enabled.add_argument(
        "--enable", dest="consume_enabled", action="store_const", const=True, help="resume"
    )
    enabled.add_argument(
        "--disable",
        dest="consume_enabled",
        action="store_const",
        const=False,
        help="pause: receives answer CONSUME_DISABLED",
    )
    u.add_argument(
        "--model",
        choices=MODELS,
        help="switch the group's consumption model (stop its consumers first)",
    )
    u.add_argument("--json", action="store_true")
    u.set_defaults(func=cmd_update, fifo=None, consume_enabled=None)

    rm = cgsub.add_parser(
        "delete",
        help="forget a consumer group's settings and model (its offsets and in-flight state stay)",
    )
    rm.add_argument("group")
    rm.set_defaults(func=cmd_delete)
    reset = group_reset.add_parser(cgsub)
    for p in (ls, d, u, rm, reset):
        add_nameserver(p)
