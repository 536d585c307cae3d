"""``tidemq topic create|list|describe|delete``."""

from __future__ import annotations

import argparse

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver, print_json


def cmd_topic_create(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        brokers = admin.create_topic(
            args.topic,
            queues=args.queues,
            read_queues=args.read_queues,
            write_queues=args.write_queues,
            perm=args.perm,
            order=args.order,
            cluster=args.cluster,
            attributes=_attributes(args),
        )
    print(f"topic {args.topic} ready on {', '.join(brokers)}")
    return 0


def _attributes(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args.attribute or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--attribute {item!r}: expected KEY=VALUE")
        out[key] = value
    if args.retention_policy:
        out["retention.policy"] = args.retention_policy
    return out


def cmd_topic_list(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        topics = admin.list_topics()
    if args.json:
        print_json(topics)
        return 0
    if not topics:
        print("no topics")
    for name, t in sorted(topics.items()):
        print(
            f"{name:40} queues r{t['read_queues']}/w{t['write_queues']}  "
            f"brokers {', '.join(t['brokers'])}"
        )
    return 0


def cmd_topic_describe(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        route = admin.route(args.topic)
        queues = admin.queue_status(args.topic, args.group)
    groups = {
        name: {
            "cluster": g.cluster,
            "addresses": {str(k): v for k, v in sorted(g.addresses.items())},
            "epoch": g.epoch,
        }
        for name, g in sorted(route.groups.items())
    }
    rows = [
        {
            "broker": q.broker,
            "queue_id": q.queue_id,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
            **({"committed_offset": q.committed_offset, "lag": q.lag} if args.group else {}),
        }
        for q in queues
    ]
    if args.json:
        print_json({"topic": args.topic, "brokers": groups, "queues": rows})
        return 0
    print(f"topic {args.topic}")
    for name, g in groups.items():
        print(f"  broker group {name} ({g['cluster']}): {g['addresses']}")
    head = f"  {'broker':16} {'queue':>5} {'min':>12} {'max':>12}"
    print(head + (f" {'committed':>12} {'lag':>10}" if args.group else ""))
    for r in rows:
        line = f"  {r['broker']:16} {r['queue_id']:>5} {r['min_offset']:>12} {r['max_offset']:>12}"
        if args.group:
            committed = "-" if r["committed_offset"] is None else r["committed_offset"]
            lag = "-" if r["lag"] is None else r["lag"]
            line += f" {committed:>12} {lag:>10}"
        print(line)
    return 0


def cmd_topic_delete(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        brokers = admin.delete_topic(args.topic)
    print(f"topic {args.topic} deleted from {', '.join(brokers) or 'no broker'}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    topic = sub.add_parser("topic", help="create, list, describe and delete topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True)
    c = tsub.add_parser("create", help="create or update a topic on every master")
    c.add_argument("topic")
    c.add_argument("--queues", type=int, default=8, help="read and write queues per broker")
    c.add_argument("--read-queues", type=int)
    c.add_argument("--write-queues", type=int)
    c.add_argument("--perm", choices=["rw", "r", "w"], default="rw")
    c.add_argument("--order", action="store_true", help="mark the topic as ordered")
    c.add_argument(
        "--retention-policy",
        choices=["archive", "delete"],
        help="archive this topic's expired messages or delete them (brokers with an archive; "
        "default: the archive's default policy; docs/archive.md)",
    )
    c.add_argument(
        "--attribute",
        action="append",
        metavar="KEY=VALUE",
        help="a topic attribute (repeatable)",
    )
    c.add_argument("--cluster", help="only the masters of this cluster")
    c.set_defaults(func=cmd_topic_create)
    ls = tsub.add_parser("list", help="topics on the masters")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_topic_list)
    d = tsub.add_parser("describe", help="route and per-queue offsets (and a group's lag)")
    d.add_argument("topic")
    d.add_argument("--group", help="also show this consumer group's offsets and lag")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_topic_describe)
    rm = tsub.add_parser("delete", help="delete a topic from every broker serving it")
    rm.add_argument("topic")
    rm.set_defaults(func=cmd_topic_delete)
    for p in (c, ls, d, rm):
        add_nameserver(p)
