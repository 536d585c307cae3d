"""Who is signed in to the console. Reading needs no sign-in; every write does, and is made with
the signed-in account's own credentials, so the brokers' ACL decides as it would for the CLI.

A session is a random token in an HttpOnly, SameSite=Strict cookie, kept in memory (a restarted
console signs everyone out) and dropped after ``idle_ms`` without a request. Each session has its
own CSRF token, which every write form carries back."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from tidemq.protos.signing import Credentials

COOKIE = "tidemq_console"
IDLE_MS = 8 * 3_600_000


@dataclass
class Session:
    token: str
    credentials: Credentials
    csrf: str
    seen_ms: int
    admin: object = field(default=None, repr=False)  # the AsyncAdmin signed as this account
    flash: str | None = None  # what the last write did, shown once on the next page
    # False when the cluster checks no credentials: the name was taken on trust.
    verified: bool = True

    @property
    def user(self) -> str:
        return self.credentials.access_key


class Sessions:
    def __init__(self, idle_ms: int = IDLE_MS) -> None:
        self.idle_ms = idle_ms
        self._by_token: dict[str, Session] = {}

    def open(
        self, credentials: Credentials, now_ms: int, admin: object = None, *, verified: bool = True
    ) -> Session:
        s = Session(
            secrets.token_urlsafe(32),
            credentials,
            secrets.token_urlsafe(24),
            now_ms,
            admin,
            verified=verified,
        )
        self._by_token[s.token] = s
        return s

    def get(self, token: str | None, now_ms: int) -> Session | None:
        if not token:
            return None
        s = self._by_token.get(token)
        if s is None:
            return None
        if now_ms - s.seen_ms > self.idle_ms:
            del self._by_token[token]
            return None
        s.seen_ms = now_ms
        return s

    def all(self) -> list[Session]:
        return list(self._by_token.values())

    def close(self, token: str) -> Session | None:
        return self._by_token.pop(token, None)

    def expired(self, now_ms: int) -> list[Session]:
        """Removes and returns the sessions idle too long (their admin clients need closing)."""
        gone = [s for s in self._by_token.values() if now_ms - s.seen_ms > self.idle_ms]
        for s in gone:
            del self._by_token[s.token]
        return gone

    def check_csrf(self, session: Session, token: str | None) -> bool:
        return token is not None and secrets.compare_digest(session.csrf, token)
