"""Consumer groups: every group with its lag and dead letters (from the last sample), and one
group's settings, members, lag per queue, in-flight and retrying messages, with a lag chart per
topic and the offset-reset form."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tidemq.console.context import CONSOLE_KEY
from tidemq.errors import TidemqError

PAGE_ROWS = 1000


async def groups_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    query = request.query.get("q", "").strip()
    groups = await console.admin.list_consumer_groups()
    lag = console.history.group_lag()
    dead = console.history.dlq_sizes()
    rows = [
        {"group": g, "lag": lag.get(g.group), "dead_letters": dead.get(g.group, 0)}
        for g in sorted(groups, key=lambda g: g.group)
        if not query or query.lower() in g.group.lower()
    ]
    return console.render(
        request,
        "groups.html",
        rows=rows[:PAGE_ROWS],
        matched=len(rows),
        total=len(groups),
        query=query,
    )


async def group_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    name = request.match_info["group"]
    group = await console.admin.get_consumer_group(name)
    topics = console.history.group_topics(name)
    names = sorted({t.topic for t in topics} | set(group.topics))
    members: dict[str, list[str] | str] = {}

    async def members_of(topic: str) -> None:
        try:
            members[topic] = await console.admin.group_members(name, topic)
        except TidemqError as e:
            members[topic] = f"unknown: {e}"

    await asyncio.gather(*(members_of(t) for t in names))
    receive = None
    if group.model == "receive":
        receive = await console.admin.receive_state(name)
    return console.render(
        request,
        "group.html",
        group=group,
        topics=topics,
        topic_names=names,
        members=members,
        receive=receive,
        dead_letters=console.history.dlq_sizes().get(name, 0),
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/groups", groups_page)
    app.router.add_get("/groups/{group}", group_page)
