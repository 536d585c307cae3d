"""Sign-in and every change the console can make.

A change is a ``Write``: what it does, to what, and the call that does it. Every write goes the
same way: the account must be signed in (else 403 and nothing happens), the form must carry the
session's CSRF token, the first post shows a confirmation page naming exactly what will change,
and only the confirmed post calls the cluster, with the signed-in account's credentials (the
brokers' ACL decides, as for the CLI). Each confirmed write is logged to ``tidemq.console.audit``
with the account, the action, the target and the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web
from multidict import MultiDictProxy

from tidemq.admin import AsyncAdmin
from tidemq.console.context import CONSOLE_KEY, Console, now_ms
from tidemq.console.pages.messages import parse_time_ms
from tidemq.console.sessions import COOKIE
from tidemq.errors import InvalidArgumentError, TidemqError
from tidemq.protos.signing import Credentials

audit = logging.getLogger("tidemq.console.audit")
log = logging.getLogger(__name__)

Form = MultiDictProxy[Any]


@dataclass(frozen=True)
class Write:
    action: str  # "delete topic"
    target: str  # "orders"
    summary: str  # one sentence on the confirmation page
    run: Callable[[AsyncAdmin], Awaitable[str]]  # does it; returns what happened
    back: str  # the page to return to


def _field(form: Form, name: str) -> str:
    value = str(form.get(name, "")).strip()
    if not value:
        raise InvalidArgumentError(f"{name} is required", code="INVALID_ARGUMENT")
    return value


def _int_field(form: Form, name: str, low: int, high: int) -> int:
    text = _field(form, name)
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(
            f"{name} {text!r} is not a number", code="INVALID_ARGUMENT"
        ) from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be {low}..{high}", code="INVALID_ARGUMENT")
    return value


def _url(prefix: str, name: str) -> str:
    return f"{prefix}/{quote(name, safe='')}"


# ---------------------------------------------------------------------- the writes
def _topic_settings(topic: str, form: Form, action: str, summary: str) -> Write:
    """Create or change a topic: both are a CreateTopic on every master with these queues."""
    queues = _int_field(form, "queues", 1, 1024)
    perm = str(form.get("perm", "rw"))

    async def run(admin: AsyncAdmin) -> str:
        brokers = await admin.create_topic(topic, queues=queues, perm=perm)
        return f"{action}: {topic} has {queues} queues ({perm}) on {', '.join(brokers)}"

    return Write(
        action,
        topic,
        f"{summary} topic {topic} with {queues} read and write queues ({perm}) on every master.",
        run,
        _url("/topics", topic),
    )


def create_topic(request: web.Request, form: Form) -> Write:
    return _topic_settings(_field(form, "topic"), form, "create topic", "Create")


def update_topic(request: web.Request, form: Form) -> Write:
    return _topic_settings(request.match_info["topic"], form, "update topic", "Set")


def delete_topic(request: web.Request, form: Form) -> Write:
    topic = request.match_info["topic"]

    async def run(admin: AsyncAdmin) -> str:
        brokers = await admin.delete_topic(topic)
        return f"topic {topic} deleted from {', '.join(brokers) or 'no broker'}"

    return Write(
        "delete topic",
        topic,
        f"Delete topic {topic} from every broker: its messages can no longer be read.",
        run,
        "/topics",
    )


def reset_offsets(request: web.Request, form: Form) -> Write:
    group = request.match_info["group"]
    topic = _field(form, "topic")
    to_text = _field(form, "to")
    to: str | int
    if to_text in ("first", "last"):
        to = to_text
        where = f"the {to_text} message"
    else:
        when = parse_time_ms(to_text, "time")
        assert when is not None
        to, where = when, f"the first message stored at or after {to_text} (UTC)"

    async def run(admin: AsyncAdmin) -> str:
        done = await admin.reset_offsets(group, topic, to)
        return f"group {group} reset on {topic}: {len(done)} queues moved to {where}"

    return Write(
        "reset offsets",
        f"{group} on {topic}",
        f"Move group {group}'s position on every queue of {topic} to {where}. Its running "
        "consumers should be stopped first, or they commit their own position over it.",
        run,
        _url("/groups", group),
    )


def delete_group(request: web.Request, form: Form) -> Write:
    group = request.match_info["group"]

    async def run(admin: AsyncAdmin) -> str:
        brokers = await admin.delete_consumer_group(group)
        return f"group {group} deleted from {', '.join(brokers) or 'no broker'}"

    return Write(
        "delete group",
        group,
        f"Delete consumer group {group}: its settings, offsets and receive state.",
        run,
        "/groups",
    )


def resend_dead_letter(request: web.Request, form: Form) -> Write:
    group = request.match_info["group"]
    msg_id = _field(form, "msg_id")

    async def run(admin: AsyncAdmin) -> str:
        result = await admin.resend_dead_letter(group, msg_id)
        return f"dead letter {msg_id} resent to group {group} as {result.msg_id}"

    return Write(
        "resend dead letter",
        f"{msg_id} of {group}",
        f"Send dead letter {msg_id} again, to group {group}'s retry topic, so the group "
        "receives it once more.",
        run,
        _url("/dlq", group),
    )


WRITES: dict[str, tuple[str, Callable[[web.Request, Form], Write]]] = {
    "/topics": ("create topic", create_topic),
    "/topics/{topic}/update": ("update topic", update_topic),
    "/topics/{topic}/delete": ("delete topic", delete_topic),
    "/groups/{group}/reset": ("reset offsets", reset_offsets),
    "/groups/{group}/delete": ("delete group", delete_group),
    "/dlq/{group}/resend": ("resend dead letter", resend_dead_letter),
}


def _handler(make: Callable[[web.Request, Form], Write]) -> Callable[..., Awaitable[Any]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        console = request.app[CONSOLE_KEY]
        session = console.session(request)
        if session is None:
            return console.render(
                request,
                "sign_in.html",
                status=403,
                error="Sign in with an admin account to change the cluster.",
                next=request.path,
            )
        form = await request.post()
        if not console.sessions.check_csrf(session, str(form.get("csrf", ""))):
            return console.render(
                request,
                "sign_in.html",
                status=403,
                error="The form expired: try again.",
                next=request.path,
            )
        write = make(request, form)
        if form.get("confirmed") != "yes":
            fields = [(k, str(v)) for k, v in form.items() if k not in ("csrf", "confirmed")]
            return console.render(request, "confirm.html", write=write, fields=fields)
        assert isinstance(session.admin, AsyncAdmin)
        try:
            result = await write.run(session.admin)
        except TidemqError as e:
            audit.warning(
                "%s: %s %s refused: %s",
                session.user,
                write.action,
                write.target,
                e,
                extra={
                    "user": session.user,
                    "action": write.action,
                    "target": write.target,
                    "outcome": "refused",
                },
            )
            raise
        audit.info(
            "%s: %s %s: %s",
            session.user,
            write.action,
            write.target,
            result,
            extra={
                "user": session.user,
                "action": write.action,
                "target": write.target,
                "outcome": "done",
            },
        )
        session.flash = result
        raise web.HTTPSeeOther(write.back)

    return handle


# ---------------------------------------------------------------------- sign-in
async def sign_in_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE_KEY]
    return console.render(request, "sign_in.html", error=None, next=request.query.get("next", "/"))


async def _open_cluster(console: Console) -> bool:
    """Whether the brokers answer an admin-only call made with no credentials at all: then they
    check none, and a sign-in proves nothing (the session says so on every page)."""
    anonymous = AsyncAdmin(console.config.nameserver, credentials=False)
    try:
        await anonymous.list_topics()
    except TidemqError:
        return False
    finally:
        await anonymous.close()
    return True


def _safe_next(text: str) -> str:
    # Only a path of this console: never an absolute URL (an open redirect).
    return text if text.startswith("/") and not text.startswith("//") else "/"


async def sign_in(request: web.Request) -> web.StreamResponse:
    console: Console = request.app[CONSOLE_KEY]
    form = await request.post()
    nxt = _safe_next(str(form.get("next", "/")))
    try:
        credentials = Credentials(str(form.get("access_key", "")), str(form.get("secret_key", "")))
    except ValueError as e:
        return console.render(request, "sign_in.html", status=400, error=str(e), next=nxt)
    admin = AsyncAdmin(console.config.nameserver, credentials=credentials)
    try:
        # An admin-only call: the brokers check the signature and that the account is an admin.
        await admin.list_topics()
    except TidemqError as e:
        await admin.close()
        audit.warning(
            "%s: sign-in refused: %s",
            credentials.access_key,
            e,
            extra={"user": credentials.access_key, "action": "sign in", "outcome": "refused"},
        )
        return console.render(
            request,
            "sign_in.html",
            status=403,
            error=f"The cluster refused this account as an admin: {e}",
            next=nxt,
        )
    verified = not await _open_cluster(console)
    session = console.sessions.open(credentials, now_ms(), admin, verified=verified)
    audit.info(
        "%s: signed in%s",
        session.user,
        "" if verified else " (unverified: open cluster)",
        extra={"user": session.user, "action": "sign in", "outcome": "done", "verified": verified},
    )
    response = web.HTTPSeeOther(nxt)
    response.set_cookie(
        COOKIE, session.token, httponly=True, samesite="Strict", secure=request.secure, path="/"
    )
    raise response


async def sign_out(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    token = request.cookies.get(COOKIE)
    session = console.sessions.close(token) if token else None
    if session is not None:
        audit.info(
            "%s: signed out",
            session.user,
            extra={"user": session.user, "action": "sign out", "outcome": "done"},
        )
        if isinstance(session.admin, AsyncAdmin):
            await session.admin.close()
    response = web.HTTPSeeOther("/")
    response.del_cookie(COOKIE, path="/")
    raise response


def add_routes(app: web.Application) -> None:
    app.router.add_get("/sign-in", sign_in_page)
    app.router.add_post("/sign-in", sign_in)
    app.router.add_post("/sign-out", sign_out)
    for path, (_, make) in WRITES.items():
        app.router.add_post(path, _handler(make))
