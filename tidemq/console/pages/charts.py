"""The JSON series the pages' charts draw (uPlot's aligned arrays), from the console's own
history: nothing here asks a broker."""

from __future__ import annotations

from aiohttp import web

from tidemq.console.context import CONSOLE_KEY, series_json


async def cluster_series(request: web.Request) -> web.Response:
    h = request.app[CONSOLE_KEY].history
    return web.json_response(
        {
            "produce": series_json(h.broker_produce_rate),
            "consume": series_json(h.broker_consume_rate),
            "replication": series_json(h.replication_lag),
        }
    )


async def topic_series(request: web.Request) -> web.Response:
    h = request.app[CONSOLE_KEY].history
    topic = request.match_info["topic"]
    rates = {}
    if topic in h.produce_rate:
        rates["produced"] = h.produce_rate[topic]
    rates.update({f"consumed by {g}": s for (g, t), s in h.consume_rate.items() if t == topic})
    return web.json_response({"rates": series_json(rates)})


async def group_series(request: web.Request) -> web.Response:
    h = request.app[CONSOLE_KEY].history
    group = request.match_info["group"]
    return web.json_response(
        {
            "lag": series_json({t: s for (g, t), s in h.lag.items() if g == group}),
            "consume": series_json({t: s for (g, t), s in h.consume_rate.items() if g == group}),
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/series/cluster", cluster_series)
    app.router.add_get("/api/series/topics/{topic}", topic_series)
    app.router.add_get("/api/series/groups/{group}", group_series)
