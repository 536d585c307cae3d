"""The console's read-only pages, one module per subject, and the JSON series the charts draw."""

from __future__ import annotations

from aiohttp import web

from tidemq.console.pages import charts, cluster, groups, messages, pending, topics


def add_routes(app: web.Application) -> None:
    for module in (cluster, topics, groups, messages, pending, charts):
        module.add_routes(app)
