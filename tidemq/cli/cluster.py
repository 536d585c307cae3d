"""``tidemq cluster status``: every broker the nameservers know, with its store figures, and
each broker group's produce and consume rates (mqadmin clusterList's InTPS/OutTPS) from two
readings of its offset table ``--interval`` apart."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tidemq.admin import Admin
from tidemq.admin.rates import broker_rates
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.durations import parse_seconds
from tidemq.cli.tables import print_table


def _rates(admin: Admin, interval_s: float) -> dict[str, dict[str, float]]:
    """broker group -> {"in_per_s", "out_per_s"}; a group that failed either reading is left
    out (its line in the status already says why it is unreachable)."""
    first, _ = admin.offset_tables()
    if interval_s >= 2:  # a pause long enough to wonder about
        print(f"measuring rates over {interval_s:g} s", file=sys.stderr, flush=True)
    time.sleep(interval_s)
    second, _ = admin.offset_tables()
    return {
        r.broker: {"in_per_s": round(r.in_per_s, 1), "out_per_s": round(r.out_per_s, 1)}
        for r in broker_rates(first, second)
    }


def cmd_cluster_status(args: argparse.Namespace) -> int:
    if args.daily is not None and args.daily <= 0:
        raise ValueError("--daily takes a number of days > 0")
    interval_s = parse_seconds(args.interval) if args.interval != "0" else 0.0
    with Admin(args.nameserver) as admin:
        rates = _rates(admin, interval_s) if interval_s else {}
        status = admin.cluster_status(daily_days=args.daily or 0)
    for c in status["clusters"]:
        for b in c["brokers"]:
            if b["broker_id"] == 0 and b["broker_name"] in rates:
                b["rates"] = rates[b["broker_name"]]
    if args.json:
        print_json(status)
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
            if "rates" in b:
                r = b["rates"]
                line += f"  in {r['in_per_s']:g} msg/s out {r['out_per_s']:g} msg/s"
            print(line)
            for detail in _replication_lines(b.get("replication")):
                print(f"      {detail}")
            f = b.get("failover")
            if f is not None:
                print(f"      {_failover_line(f)}")
    if args.daily:
        _print_daily(status)
    return 0


def _print_daily(status: dict[str, Any]) -> None:
    """Each master's days, newest first (a slave counts the same messages again)."""
    rows = [
        (d["day"], b["broker_name"], d["topic"], d["messages_in"], d["messages_out"])
        for c in status["clusters"]
        for b in c["brokers"]
        if b["broker_id"] == 0
        for d in b.get("daily", [])
    ]
    rows.sort(key=lambda r: (r[1], r[2]))
    rows.sort(key=lambda r: r[0], reverse=True)  # stable: newest day first, then by name
    print()
    if not rows:
        print("no daily statistics yet")
        return
    print_table(("DAY", "BROKER", "TOPIC", "IN", "OUT"), rows)


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


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cl = sub.add_parser("cluster", help="cluster status")
    csub = cl.add_subparsers(dest="cluster_command", required=True)
    st = csub.add_parser("status", help="brokers, roles and store figures")
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--interval",
        default="1s",
        metavar="DURATION",
        help="measure each broker group's messages in and out per second over this long "
        "(default 1s; 0: do not measure)",
    )
    st.add_argument(
        "--daily",
        type=int,
        nargs="?",
        const=7,
        metavar="DAYS",
        help="also messages in and out per topic per day (UTC), the last DAYS days (default 7)",
    )
    add_nameserver(st)
    st.set_defaults(func=cmd_cluster_status)
