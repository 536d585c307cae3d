"""What every request handler of the console shares: its settings, the read-side admin client,
the sampler and its history, the sessions, and the templates with their filters."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from aiohttp import web

from tidemq.admin import AsyncAdmin
from tidemq.console.history import History, Series
from tidemq.console.sampler import Sampler
from tidemq.console.sessions import COOKIE, Session, Sessions


@dataclass(frozen=True)
class ConsoleConfig:
    nameserver: str
    sample_interval_s: float = 10.0
    history_window_ms: int = 3_600_000
    session_idle_ms: int = 8 * 3_600_000

    def __post_init__(self) -> None:
        if not self.sample_interval_s > 0:
            raise ValueError(f"sample interval {self.sample_interval_s} s must be above 0")
        if self.history_window_ms < self.sample_interval_s * 1000:
            raise ValueError("the history window must hold at least one sample interval")


def now_ms() -> int:
    return int(time.time() * 1000)


def format_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def preview(body: bytes, chars: int = 80) -> str:
    """The start of a body as text (undecodable bytes replaced), cut with an ellipsis."""
    text = body[: chars * 4].decode("utf-8", "replace")
    return text if len(text) <= chars else text[: chars - 1] + "…"


def format_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}/s"


class Console:
    """Everything a request handler needs: the read-side admin client, the sampler and its
    history, the sessions, the templates."""

    def __init__(self, config: ConsoleConfig, admin: AsyncAdmin) -> None:
        self.config = config
        self.admin = admin
        self.history = History(config.history_window_ms)
        self.sampler = Sampler(admin, self.history, config.sample_interval_s)
        self.sessions = Sessions(config.session_idle_ms)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("tidemq.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            enable_async=False,
        )
        self.templates.filters.update(
            time=format_ms, bytes=format_bytes, rate=format_rate, preview=preview
        )

    def session(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE), now_ms())

    def render(
        self, request: web.Request, template: str, status: int = 200, **values: Any
    ) -> web.Response:
        session = self.session(request)
        flash = None
        if session is not None:
            flash, session.flash = session.flash, None
        html = self.templates.get_template(template).render(
            session=session,
            path=request.path,
            flash=flash,
            sample_error=self.sampler.error,
            sampled_ms=self.history.last_ms,
            interval_s=self.config.sample_interval_s,
            **values,
        )
        return web.Response(text=html, content_type="text/html", status=status)


CONSOLE_KEY = web.AppKey("console", Console)


def series_json(series: dict[str, Series]) -> dict[str, Any]:
    """uPlot's shape: one x array (seconds) and one y array per series, aligned on the union of
    the sample times (a series missing a sample has null there)."""
    times = sorted({t for s in series.values() for t, _ in s.points})
    index = {t: i for i, t in enumerate(times)}
    out: dict[str, Any] = {"t": [t / 1000 for t in times], "series": {}}
    for name, s in sorted(series.items()):
        ys: list[float | None] = [None] * len(times)
        for t, v in s.points:
            ys[index[t]] = v
        out["series"][name] = ys
    return out
