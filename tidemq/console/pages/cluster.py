"""The cluster page: broker groups, their roles and epochs, in-sync sets, replication lag, disk,
and produce/consume rates; charts of the rates and of each slave's lag."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tidemq.console.context import CONSOLE_KEY


def broker_groups(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The sampled cluster status grouped by broker group: each with its brokers (master first)
    and the group's in-sync set and epoch as its brokers report them."""
    out = []
    for cluster in status.get("clusters", []):
        by_name: dict[str, list[dict[str, Any]]] = {}
        for b in cluster["brokers"]:
            by_name.setdefault(b["broker_name"], []).append(b)
        for name, brokers in sorted(by_name.items()):
            brokers.sort(
                key=lambda b: (b["role"] not in ("SYNC_MASTER", "ASYNC_MASTER"), b["broker_id"])
            )
            failover = next((b["failover"] for b in brokers if "failover" in b), None)
            out.append(
                {
                    "cluster": cluster["cluster"],
                    "name": name,
                    "brokers": brokers,
                    "epoch": max((b["epoch"] for b in brokers), default=0),
                    "isr": failover["isr"] if failover else None,
                    "waiting_reason": failover["waiting_reason"] if failover else "",
                }
            )
    return out


async def cluster_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    h = console.history
    return console.render(
        request,
        "cluster.html",
        groups=broker_groups(console.sampler.status),
        nameserver=console.sampler.status.get("nameserver"),
        failed=console.sampler.failed,
        produce={b: s.last for b, s in h.broker_produce_rate.items()},
        consume={b: s.last for b, s in h.broker_consume_rate.items()},
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", cluster_page)
