"""Client commands of the ``tidemq`` CLI: topics, send, consume, cluster status, bench.

All of them find the cluster through ``--nameserver`` (or $TIDEMQ_NAMESERVER, default
127.0.0.1:9876). Failures are one line on stderr and exit code 1; bad usage is exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from tidemq._runtime import DEFAULT_NAMESERVER, NAMESERVER_ENV
from tidemq.admin import Admin
from tidemq.bench import run_consume_bench, run_produce_bench
from tidemq.consumer import Consumer
from tidemq.producer import Producer


def _add_nameserver(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nameserver",
        metavar="HOST:PORT[,...]",
        help=f"nameserver address(es) (default ${NAMESERVER_ENV} or {DEFAULT_NAMESERVER})",
    )


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# ---------------------------------------------------------------------- topic
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
        )
    print(f"topic {args.topic} ready on {', '.join(brokers)}")
    return 0


def cmd_topic_list(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        topics = admin.list_topics()
    if args.json:
        _print_json(topics)
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
        _print_json({"topic": args.topic, "brokers": groups, "queues": rows})
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


# ---------------------------------------------------------------------- send / consume
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
                sharding_key=args.sharding_key,
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
        if not args.no_commit:
            consumer.commit()
    if not args.json:
        print(f"{received} message(s)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- cluster
def cmd_cluster_status(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        status = admin.cluster_status()
    if args.json:
        _print_json(status)
        return 0
    ns = status["nameserver"]
    stale = " (STALE: registry unreachable, last known routes)" if ns["stale"] else ""
    print(f"nameserver: {ns['registry']} registry, {ns['brokers']} broker(s){stale}")
    if not status["clusters"]:
        print("no brokers registered")
    for c in status["clusters"]:
        print(f"cluster {c['cluster']}")
        for b in c["brokers"]:
            line = (
                f"  {b['broker_name']}/{b['broker_id']} {b['role']:12} {b['address']:21} "
                f"epoch {b['epoch']} topics {b['topics']}"
            )
            if b["reachable"]:
                s = b["store"]
                line += (
                    f"  commitlog [{s['commitlog_min_offset']}, {s['commitlog_max_offset']})"
                    f" disk {s['disk_usage_ratio']:.0%}"
                    + ("" if s["writable"] else " NOT WRITABLE")
                )
            else:
                line += f"  UNREACHABLE: {b['error']}"
            print(line)
            for detail in _replication_lines(b.get("replication")):
                print(f"      {detail}")
            f = b.get("failover")
            if f is not None:
                print(f"      {_failover_line(f)}")
    return 0


def _failover_line(f: dict[str, Any]) -> str:
    master = "no master" if f["master_id"] < 0 else f"master {f['master_id']}"
    line = (
        f"automatic failover: group epoch {f['group_epoch']}, {master}, in sync {f['isr']}; "
        f"this broker {f['role']} (epoch file at {f['local_epoch']}, priority {f['priority']})"
    )
    if f["role"] != "SLAVE" and not f["acknowledging"]:
        line += ", NOT ACKNOWLEDGING"
    if f["waiting_reason"]:
        line += f"; waiting: {f['waiting_reason']}"
    return line


def cmd_group_switchover(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        result = admin.switchover(args.group, args.to)
    if args.json:
        _print_json(result)
    else:
        print(
            f"{args.group}: broker {result['master_id']} is master at epoch {result['epoch']} "
            f"(sends paused {result['writes_paused_ms']} ms)"
        )
    return 0


def _replication_lines(rs: dict[str, Any] | None) -> list[str]:
    if rs is None:
        return []
    lines = []
    for s in rs["slaves"]:
        secs = "?" if s["lag_seconds"] < 0 else f"{s['lag_seconds']:.1f} s"
        lines.append(
            f"slave {s['broker_id']} {s['address']:21} behind {s['lag_bytes']} bytes, {secs}"
            + ("" if s["in_sync"] else "  NOT IN SYNC")
        )
    master = rs.get("master")
    if master is not None:
        state = "streaming" if master["connected"] else "NOT CONNECTED"
        lines.append(
            f"replicating from {master['address']} ({state}), behind {master['lag_bytes']} bytes"
        )
    if rs["confirm_offset_enabled"]:
        lines.append(f"confirm offset {rs['confirmed_offset']}")
    return lines


# ---------------------------------------------------------------------- bench
def cmd_bench_produce(args: argparse.Namespace) -> int:
    result = run_produce_bench(
        args.nameserver,
        topic=args.topic,
        messages=args.messages,
        body_bytes=args.body_bytes,
        unbatched=args.unbatched,
        progress=not args.json,
        rate=args.rate,
    )
    print(json.dumps(result))
    return 0


def cmd_bench_consume(args: argparse.Namespace) -> int:
    result = run_consume_bench(
        args.nameserver,
        topic=args.topic,
        group=args.group or f"bench-{uuid.uuid4().hex[:8]}",
        messages=args.messages,
        progress=not args.json,
    )
    print(json.dumps(result))
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
        _add_nameserver(p)

    s = sub.add_parser("send", help="send a message")
    s.add_argument("topic")
    s.add_argument("body")
    s.add_argument("--tag")
    s.add_argument("--key", action="append", default=[], help="a message key (repeatable)")
    s.add_argument(
        "--property", action="append", default=[], metavar="NAME=VALUE", help="(repeatable)"
    )
    s.add_argument("--sharding-key", help="same key, same queue: ordered per key")
    s.add_argument("--count", type=int, default=1, help="send the message this many times")
    s.add_argument("--json", action="store_true", help="one JSON object per result")
    _add_nameserver(s)
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
    _add_nameserver(r)
    r.set_defaults(func=cmd_consume)

    cl = sub.add_parser("cluster", help="cluster status")
    csub = cl.add_subparsers(dest="cluster_command", required=True)
    st = csub.add_parser("status", help="brokers, roles and store figures")
    st.add_argument("--json", action="store_true")
    _add_nameserver(st)
    st.set_defaults(func=cmd_cluster_status)

    g = sub.add_parser("group", help="broker groups")
    gsub = g.add_subparsers(dest="group_command", required=True)
    so = gsub.add_parser(
        "switchover", help="hand a group's mastership to an in-sync broker (automatic failover)"
    )
    so.add_argument("group", help="broker group (broker name)")
    so.add_argument("--to", type=int, required=True, metavar="BROKER_ID", help="the new master")
    so.add_argument("--json", action="store_true")
    _add_nameserver(so)
    so.set_defaults(func=cmd_group_switchover)

    b = sub.add_parser("bench", help="measure produce and consume rates (JSON)")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    bp = bsub.add_parser("produce", help="one producer process, SDK batching")
    bp.add_argument("--topic", default="BenchTopic")
    bp.add_argument("--messages", type=int, default=200_000)
    bp.add_argument("--body-bytes", type=int, default=1024)
    bp.add_argument(
        "--unbatched",
        action="store_true",
        help="one message per request, one in flight: latency percentiles",
    )
    bp.add_argument(
        "--rate",
        type=float,
        metavar="MSGS_PER_S",
        help="send at this many messages per second, warm-up included (default: as fast as "
        "possible); msgs_per_s then reports the rate achieved",
    )
    bp.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    _add_nameserver(bp)
    bp.set_defaults(func=cmd_bench_produce)
    bc = bsub.add_parser("consume", help="read what the topic holds with a new group")
    bc.add_argument("--topic", default="BenchTopic")
    bc.add_argument("--messages", type=int, default=200_000)
    bc.add_argument("--group")
    bc.add_argument("--json", action="store_true", help="JSON only, no progress lines")
    _add_nameserver(bc)
    bc.set_defaults(func=cmd_bench_consume)
