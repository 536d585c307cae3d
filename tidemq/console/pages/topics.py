"""Topics: every topic with its queues, stored messages and produce rate (from the last sample),
and one topic's queues per broker group with their offsets, the groups consuming it and a chart
of its rates. The forms here post to ``writes``."""

from __future__ import annotations

from aiohttp import web

from tidemq.admin.rates import SYSTEM_PREFIX
from tidemq.console.context import CONSOLE_KEY

PAGE_ROWS = 1000


async def topics_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    query = request.query.get("q", "").strip()
    show_system = request.query.get("system") == "1"
    topics = await console.admin.list_topics()
    totals = console.history.topic_totals()
    rates = console.history.produce_rate
    rows = []
    for name, t in sorted(topics.items()):
        if query and query.lower() not in name.lower():
            continue
        if name.startswith(SYSTEM_PREFIX) and not show_system:
            continue
        rate = rates.get(name)
        rows.append(
            {
                "topic": name,
                "brokers": t["brokers"],
                "read_queues": t["read_queues"],
                "write_queues": t["write_queues"],
                "stored": totals.get(name),
                "rate": rate.last if rate else None,
            }
        )
    return console.render(
        request,
        "topics.html",
        rows=rows[:PAGE_ROWS],
        matched=len(rows),
        total=len(topics),
        query=query,
        show_system=show_system,
    )


async def topic_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    topic = request.match_info["topic"]
    route = await console.admin.route(topic)
    queues = await console.admin.queue_status(topic)
    consumers = sorted(
        (g for (_, t), g in console.history.groups.items() if t == topic), key=lambda g: g.group
    )
    return console.render(
        request,
        "topic.html",
        topic=topic,
        route=route,
        queues=queues,
        consumers=consumers,
        write_queues=len(route.write_queues),
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/topics", topics_page)
    app.router.add_get("/topics/{topic}", topic_page)
