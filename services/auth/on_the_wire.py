"""The guard on a gRPC server: reads who is calling from the call (peer address, metadata, the
verified client certificate), runs ``Guard``, and refuses with a typed error that is logged and
counted. The ACL file is re-read when it changes (looked at once a second at most, from the
calls themselves); a file that no longer parses is logged and the last good ACL kept."""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from tidemq.protos import common_pb2
from tidemq.services.auth import acl as acl_file
from tidemq.services.auth.guard import Caller, Guard, Refusal, Who
from tidemq.services.errors import ServiceError, abort_with

log = logging.getLogger(__name__)

RELOAD_CHECK_INTERVAL_S = 1.0
REFUSAL_LOG_INTERVAL_S = 10.0
MAX_LOGGED_KINDS = 10_000
# Who made the call being served (for checks that need the request's later messages, as a
# slave's handshake): set by ``WireGuard.admit``.
current_caller: contextvars.ContextVar[Who | None] = contextvars.ContextVar(
    "tidemq_caller", default=None
)


class AclSource:
    """The ACL file's current contents, re-read when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.acl = acl_file.load(path)  # AclFileError at start: the server does not start
        self._stamp = self._read_stamp()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = 0
        _warn_white_lists(self.acl, path)

    def _read_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> acl_file.Acl:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_INTERVAL_S:
            return self.acl
        with self._lock:
            self._checked = now
            stamp = self._read_stamp()
            if stamp is None or stamp == self._stamp:
                return self.acl
            try:
                acl = acl_file.load(self.path)
            except acl_file.AclFileError as e:
                log.error(  # noqa: TRY400 (the message is the whole story, not a traceback)
                    "ACL file changed but is not usable, keeping the last good one: %s", e
                )
                self._stamp = stamp  # logged once per change
                return self.acl
            self.acl, self._stamp = acl, stamp
            self.reloads += 1
            log.info("ACL file %s reloaded: %d accounts", self.path, len(acl.accounts))
            _warn_white_lists(acl, self.path)
            return acl


def _warn_white_lists(acl: acl_file.Acl, path: str) -> None:
    if acl.global_white_addresses:
        log.warning(
            "SECURITY: %s has globalWhiteRemoteAddresses (%s): calls from there need no "
            "credentials and may do anything, as in RocketMQ",
            path,
            ", ".join(p.text for p in acl.global_white_addresses),
        )


def _ip(peer: str) -> str:
    """The IP of a gRPC peer string: ``ipv4:10.0.0.1:5555`` or ``ipv6:[::1]:5555``."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return ""


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
    auth = context.auth_context() or {}
    name = None
    if auth.get("transport_security_type") == [b"ssl"] and auth.get("x509_common_name"):
        name = auth["x509_common_name"][0].decode(errors="replace")
    return Caller(_ip(context.peer()), metadata, name)


_CODES = {
    "UNAUTHENTICATED": (grpc.StatusCode.UNAUTHENTICATED, common_pb2.UNAUTHENTICATED),
    "PERMISSION_DENIED": (grpc.StatusCode.PERMISSION_DENIED, common_pb2.ACCESS_DENIED),
}


def service_error(refusal: Refusal) -> ServiceError:
    status, code = _CODES[refusal.status]
    return ServiceError(status, code, str(refusal))


class WireGuard:
    """``Guard`` on a server: ``admit`` is called with each decoded request (and with None at
    the start of a bidirectional stream) before its handler runs."""

    def __init__(
        self,
        make_guard: Callable[[acl_file.Acl | None], Guard],
        acl: AclSource | None,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self._make_guard = make_guard
        self.acl = acl
        self._acl_seen: acl_file.Acl | None = None
        self.guard = make_guard(acl.acl if acl else None)
        self.on_refused = on_refused
        self.refused = 0
        # (method, reason) -> (monotonic s of its last log line, refusals not logged since)
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

    def _current(self) -> Guard:
        if self.acl is not None:
            acl = self.acl.current()
            if acl is not self.guard.acl:
                self.guard = self._make_guard(acl)
        return self.guard

    async def admit(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Who:
        caller = caller_of(context)
        try:
            who = self._current().check(method, caller, request)
        except Refusal as refusal:
            await self.refuse(method, refusal, caller, context)
        current_caller.set(who)
        return who

    async def refuse(
        self, method: str, refusal: Refusal, caller: Caller, context: grpc.aio.ServicerContext
    ) -> Any:
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused(method.rsplit("/", 1)[-1], refusal.reason)
        self._log(method, refusal, caller.ip or context.peer())
        await abort_with(context, service_error(refusal))

    def _log(self, method: str, refusal: Refusal, peer: str) -> None:
        """One line per kind of refusal per interval: a client retrying, or someone probing,
        must not flood the log (the metric counts every one)."""
        key = (method, refusal.reason)
        now = time.monotonic()
        last, quiet = self._logged.get(key, (-float("inf"), 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._logged[key] = (last, quiet + 1)
            return
        if len(self._logged) > MAX_LOGGED_KINDS:
            self._logged.clear()
        self._logged[key] = (now, 0)
        more = f" ({quiet} more like it not logged)" if quiet else ""
        log.warning("refused %s from %s: %s%s", method, peer, refusal, more)


def wire_guard(
    *,
    acl_path: str,
    brokers_by_certificate: bool,
    max_clock_skew_ms: int,
    own_group: str | None,
    on_refused: Callable[[str, str], None] | None = None,
) -> WireGuard | None:
    """A server's guard: None when it has neither an ACL file nor mutual TLS (nothing to check);
    ``AclFileError`` when the ACL file is unusable."""
    if not acl_path and not brokers_by_certificate:
        return None
    source = AclSource(acl_path) if acl_path else None

    def make(acl: acl_file.Acl | None) -> Guard:
        return Guard(
            acl,
            brokers_by_certificate=brokers_by_certificate,
            max_clock_skew_ms=max_clock_skew_ms,
            own_group=own_group,
            now_s=time.time,
        )

    return WireGuard(make, source, on_refused)
