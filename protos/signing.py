"""Signed requests: the ``authorization`` header of the RocketMQ 5 protocol, used on every tidemq
service too (docs/security.md), so one access key and secret key work with tidemq's SDK, its CLI
and the official RocketMQ clients.

A request carries two metadata entries::

    x-mq-date-time: 20261201T223040Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(secret key, the x-mq-date-time value)>

The date is ``YYYYMMDDTHHMMSSZ`` (the official Java and Node.js clients write UTC; the Python
client writes its local time with the same ``Z``, so run it in UTC). A server accepts a date
within its clock-skew bound of its own clock, which bounds how long a captured header can be
replayed; over TLS a header cannot be captured at all. The signature covers the date only (the
protocol's design), so the header proves who sent it, and TLS protects what it came with.
"""

from __future__ import annotations

import calendar
import collections
import hashlib
import hmac
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

DATE_TIME_KEY = "x-mq-date-time"
AUTHORIZATION_KEY = "authorization"
ALGORITHM = "MQv2-HMAC-SHA1"
ENV_ACCESS_KEY = "TIDEMQ_ACCESS_KEY"
ENV_SECRET_KEY = "TIDEMQ_SECRET_KEY"

_DATE_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z\Z")
# Credential=<ak>, SignedHeaders=<names>, Signature=<hex>; spaces after commas are optional.
_FIELD_RE = re.compile(r"\s*([A-Za-z]+)=([^,]*)")
MAX_HEADER_CHARS = 1024


class SignatureFormatError(ValueError):
    """An ``authorization`` or ``x-mq-date-time`` header that is not in the protocol's form."""


def format_date_time(epoch_s: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_s))


def parse_date_time(value: str) -> int:
    """Seconds since the epoch of a ``YYYYMMDDTHHMMSSZ`` date (read as UTC)."""
    m = _DATE_RE.match(value)
    if m is None:
        raise SignatureFormatError(f"{DATE_TIME_KEY} {value[:40]!r} is not YYYYMMDDTHHMMSSZ")
    year, month, day, hour, minute, second = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise SignatureFormatError(f"{DATE_TIME_KEY} {value!r} is not a date")
    try:
        return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        raise SignatureFormatError(f"{DATE_TIME_KEY} {value!r} is not a date") from None


def signature(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


@dataclass(frozen=True)
class Authorization:
    access_key: str
    signed_headers: tuple[str, ...]
    signature: bytes

    def verifies(self, secret_key: str, date_time: str) -> bool:
        expected = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(expected, self.signature)


def parse_authorization(value: str) -> Authorization:
    """The parts of an ``authorization`` header; ``SignatureFormatError`` when malformed."""
    if len(value) > MAX_HEADER_CHARS:
        raise SignatureFormatError(f"authorization header longer than {MAX_HEADER_CHARS} chars")
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureFormatError(f"authorization algorithm {algorithm[:40]!r} is not {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        m = _FIELD_RE.fullmatch(part)
        if m is None:
            raise SignatureFormatError(f"authorization part {part.strip()[:40]!r} is not K=V")
        fields[m.group(1)] = m.group(2).strip()
    missing = {"Credential", "SignedHeaders", "Signature"} - fields.keys()
    if missing:
        raise SignatureFormatError(f"authorization lacks {', '.join(sorted(missing))}")
    try:
        sig = bytes.fromhex(fields["Signature"])
    except ValueError:
        raise SignatureFormatError("authorization Signature is not hex") from None
    headers = tuple(h.strip().lower() for h in fields["SignedHeaders"].split(";") if h.strip())
    if DATE_TIME_KEY not in headers:
        raise SignatureFormatError(f"authorization does not sign {DATE_TIME_KEY}")
    return Authorization(fields["Credential"], headers, sig)


@dataclass(frozen=True)
class Credentials:
    """An access key and its secret key; every request a client makes is signed with them."""

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")
        if any(c in self.access_key for c in ", =\r\n"):
            raise ValueError("an access key cannot hold spaces, commas, '=' or line breaks")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """From ``TIDEMQ_ACCESS_KEY``/``TIDEMQ_SECRET_KEY``; None when neither is set."""
        env = os.environ if environ is None else environ
        ak, sk = env.get(ENV_ACCESS_KEY, ""), env.get(ENV_SECRET_KEY, "")
        if not ak and not sk:
            return None
        return cls(ak, sk)

    def metadata(self, now_s: float | None = None) -> tuple[tuple[str, str], tuple[str, str]]:
        date_time = format_date_time(time.time() if now_s is None else now_s)
        return (
            (DATE_TIME_KEY, date_time),
            (
                AUTHORIZATION_KEY,
                f"{ALGORITHM} Credential={self.access_key}, SignedHeaders={DATE_TIME_KEY}, "
                f"Signature={signature(self.secret_key, date_time)}",
            ),
        )


class Signer:
    """A client's signed metadata, made once a second (the date's resolution), not per call."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self._second = -1
        self._metadata: tuple[tuple[str, str], ...] = ()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._metadata = self.credentials.metadata(second)
            self._second = second
        return self._metadata


def resolve(credentials: Credentials | bool | None) -> Credentials | None:
    """A client's ``credentials=`` argument: ``Credentials``, False (none, whatever the
    environment says) or None (``TIDEMQ_ACCESS_KEY``/``TIDEMQ_SECRET_KEY`` decide)."""
    if credentials is None:
        return Credentials.from_env()
    if credentials is False:
        return None
    if not isinstance(credentials, Credentials):
        raise TypeError(
            f"credentials must be Credentials, False or None, not {type(credentials).__name__}"
        )
    return credentials


def _signed(details: Any, signer: Signer) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), *signer.metadata())
    return details._replace(metadata=metadata)


# grpc.aio's interceptor classes are untyped (Any) to mypy.
class SigningInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Signs every call of a channel (the four kinds of call alike)."""

    def __init__(self, credentials: Credentials) -> None:
        self.signer = Signer(credentials)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_signed(details, self.signer), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_signed(details, self.signer), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_signed(details, self.signer), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_signed(details, self.signer), requests)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,  # type: ignore[misc]
):
    pass


def _signed_sync(details: Any, signer: Signer) -> Any:
    return _CallDetails(
        details.method,
        details.timeout,
        [*(details.metadata or ()), *signer.metadata()],
        details.credentials,
        details.wait_for_ready,
        getattr(details, "compression", None),
    )


class SyncSigningInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """``SigningInterceptor`` for blocking channels (``grpc.intercept_channel``)."""

    def __init__(self, credentials: Credentials) -> None:
        self.signer = Signer(credentials)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_signed_sync(details, self.signer), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_signed_sync(details, self.signer), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_signed_sync(details, self.signer), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(_signed_sync(details, self.signer), requests)
