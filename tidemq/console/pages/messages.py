"""Messages: look one up by id, by key or by time range; show its body, properties and life
(stored, delivered to whom and how often, acked or dead-lettered); dead-letter queues to browse
and resend from."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

from aiohttp import web

from tidemq.console.context import CONSOLE_KEY
from tidemq.errors import InvalidArgumentError

SEARCH_LIMIT = 200
BODY_PREVIEW_BYTES = 64 * 1024


def parse_time_ms(text: str, what: str) -> int | None:
    """A ``datetime-local`` field (UTC) or milliseconds since the epoch; None when empty."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.removesuffix("Z"))
    except ValueError:
        raise InvalidArgumentError(
            f"{what} {text!r} is not a time (YYYY-MM-DDTHH:MM[:SS], UTC) or milliseconds",
            code="INVALID_ARGUMENT",
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def body_view(body: bytes) -> dict[str, object]:
    """The body as text when it is UTF-8, else as base64; cut at the preview size."""
    shown = body[:BODY_PREVIEW_BYTES]
    try:
        return {"text": shown.decode("utf-8"), "encoding": "utf-8", "size": len(body)}
    except UnicodeDecodeError:
        return {
            "text": base64.b64encode(shown).decode("ascii"),
            "encoding": "base64",
            "size": len(body),
        }


async def messages_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    q = request.query
    msg_id = q.get("id", "").strip()
    if msg_id:
        raise web.HTTPFound(f"/messages/{msg_id}")
    topic, key = q.get("topic", "").strip(), q.get("key", "").strip()
    since, until = q.get("since", ""), q.get("until", "")
    results = None
    if topic:
        results = await console.admin.find_messages(
            topic,
            key=key or None,
            begin_ms=parse_time_ms(since, "since"),
            end_ms=parse_time_ms(until, "until"),
            limit=SEARCH_LIMIT,
        )
    elif key or since or until:
        raise InvalidArgumentError("a search by key or time needs a topic", code="INVALID_ARGUMENT")
    return console.render(
        request,
        "messages.html",
        results=results,
        topic=topic,
        key=key,
        since=since,
        until=until,
        limit=SEARCH_LIMIT,
    )


async def message_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    msg_id = request.match_info["msg_id"]
    try:
        binascii.unhexlify(msg_id)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(
            f"{msg_id!r} is not a message id (hexadecimal)", code="INVALID_MESSAGE_ID"
        ) from None
    history = await console.admin.message_history(msg_id)
    return console.render(
        request,
        "message.html",
        history=history,
        m=history.message,
        body=body_view(history.message.body),
    )


async def dlq_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    sizes = console.history.dlq_sizes()
    return console.render(request, "dlq.html", sizes=sorted(sizes.items()))


async def dlq_group_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    group = request.match_info["group"]
    letters = await console.admin.dead_letters(group, limit=SEARCH_LIMIT)
    return console.render(request, "dlq_group.html", group=group, letters=letters)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/messages", messages_page)
    app.router.add_get("/messages/{msg_id}", message_page)
    app.router.add_get("/dlq", dlq_page)
    app.router.add_get("/dlq/{group}", dlq_group_page)
