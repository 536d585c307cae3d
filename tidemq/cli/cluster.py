"""``tidemq cluster status``: every broker the nameservers know, with its store figures."""

from __future__ import annotations

import argparse
from typing import Any

from tidemq.admin import Admin
from tidemq.cli.common import add_nameserver, print_json


def cmd_cluster_status(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        status = admin.cluster_status()
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
    add_nameserver(st)
    st.set_defaults(func=cmd_cluster_status)
