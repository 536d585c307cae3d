"""The console's web application (aiohttp, Jinja2 templates): the pages, the series the charts
draw, sign-in and the write path every change goes through (``writes``).

Pages are rendered on the server from the sampler's last figures plus the few live calls a page
needs (a broker group's status, one group's members); nothing on a page waits on a call per topic
or per group, so a page of 1,000 topics renders as fast as one of ten."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

from aiohttp import web

from tidemq.admin import AsyncAdmin
from tidemq.console import pages, writes
from tidemq.console.context import CONSOLE_KEY, Console, now_ms
from tidemq.console.sessions import Session
from tidemq.errors import TidemqError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A broker's typed error becomes a page that says what failed; nothing else is caught here
    (aiohttp answers 500 for a bug and logs it)."""
    try:
        return await handler(request)
    except TidemqError as e:
        console = request.app[CONSOLE_KEY]
        status = 404 if "NOT_FOUND" in (e.code or "") else 502 if e.retriable else 400
        return console.render(request, "error.html", status=status, error=e)


async def healthz(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    return web.json_response(
        {
            "ok": True,
            "samples": console.sampler.samples,
            "last_sample_ms": console.history.last_ms,
            "sample_error": console.sampler.error,
        }
    )


def build_app(console: Console) -> web.Application:
    app = web.Application(middlewares=[errors])
    app[CONSOLE_KEY] = console
    static = resources.files("tidemq.console") / "static"
    app.router.add_static("/static/", str(static), append_version=False)
    app.router.add_get("/healthz", healthz)
    pages.add_routes(app)
    writes.add_routes(app)
    app.cleanup_ctx.append(_background)
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    console = app[CONSOLE_KEY]
    sampling = asyncio.create_task(console.sampler.run(), name="console-sampler")
    expiring = asyncio.create_task(_expire_sessions(console), name="console-sessions")
    yield
    for task in (sampling, expiring):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for session in list(console.sessions.all()):
        await _close_admin(session)
    await console.admin.close()


async def _expire_sessions(console: Console) -> None:
    while True:
        await asyncio.sleep(60)
        for session in console.sessions.expired(now_ms()):
            log.info("console session of %s expired", session.user)
            await _close_admin(session)


async def _close_admin(session: Session) -> None:
    admin = session.admin
    if isinstance(admin, AsyncAdmin):
        await admin.close()
