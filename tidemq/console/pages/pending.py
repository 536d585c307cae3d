"""Delayed messages waiting for their time and transactions waiting for their outcome."""

from __future__ import annotations

from aiohttp import web

from tidemq.console.context import CONSOLE_KEY

LIST_LIMIT = 200


async def pending_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    topic = request.query.get("topic", "").strip() or None
    delayed = await console.admin.list_delayed(topic, limit=LIST_LIMIT)
    transactions = await console.admin.list_transactions(limit=LIST_LIMIT)
    return console.render(
        request,
        "pending.html",
        delayed=delayed,
        transactions=transactions,
        topic=topic or "",
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/pending", pending_page)
