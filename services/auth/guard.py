"""The decision for one call (docs/security.md): who is calling (authentication) and whether
they may make this call on what it names (authorization). No sockets and no clock of its own:
the wire adapter (``on_the_wire``) hands in what the connection and the metadata say.

Who a caller is, in order:

1. A broker of the cluster: a verified client certificate whose common name is
   ``broker:<broker name>:<broker id>``. Brokers may make the cluster's own calls
   (registration, replication, config sync) as the broker they prove to be, and any other call.
2. An account of the ACL file, by the request's signed ``authorization`` header (RocketMQ 5's,
   ``tidemq.protos.signing``), within the clock-skew bound.
3. Without credentials: a peer on the ACL's global white list (RocketMQ's meaning: trusted, with
   every permission), or, without an ACL file, anyone (mutual TLS alone then decides).

Refusals are typed: ``UNAUTHENTICATED`` when the caller is not known, ``PERMISSION_DENIED`` when
it is but may not; each message names the access key and the resource, never a secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemq.protos import signing
from tidemq.services.auth.acl import Account, Acl
from tidemq.services.auth.rules import RULES, Kind, Need, Rule

BROKER_NAME_RE = re.compile(r"^broker:([^:]+):(\d{1,9})\Z")


def broker_certificate_name(broker_name: str, broker_id: int) -> str:
    """The common name a broker's certificate carries."""
    return f"broker:{broker_name}:{broker_id}"


@dataclass(frozen=True)
class BrokerPeer:
    name: str
    broker_id: int

    def __str__(self) -> str:
        return broker_certificate_name(self.name, self.broker_id)


@dataclass(frozen=True)
class Caller:
    """What the connection and the call's metadata say."""

    ip: str
    metadata: Mapping[str, str]
    certificate_name: str | None = None  # the CN of a verified client certificate


@dataclass(frozen=True)
class Who:
    account: Account | None = None
    broker: BrokerPeer | None = None
    white_listed: bool = False  # no credentials, from a globally white-listed address

    def __str__(self) -> str:
        if self.broker is not None:
            return f"broker {self.broker}"
        if self.account is not None:
            return f"access key {self.account.access_key!r}"
        return "a white-listed address" if self.white_listed else "an anonymous caller"


class Refusal(Exception):
    """A call refused: ``status`` is the gRPC status name, ``reason`` a short label for the
    metric (no_credentials, malformed, unknown_key, stale_date, bad_signature, denied,
    not_a_broker, wrong_identity)."""

    def __init__(self, status: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _unauthenticated(reason: str, message: str) -> Refusal:
    return Refusal("UNAUTHENTICATED", reason, message)


def _denied(reason: str, message: str) -> Refusal:
    return Refusal("PERMISSION_DENIED", reason, message)


class Guard:
    """Checks calls against ``acl`` (None: no ACL file, any caller is admitted) and, with
    ``brokers_by_certificate``, admits the cluster's own calls only from brokers' certificates.
    ``own_group``: the broker group this server is (None on a nameserver): config sync and
    replication are for its own members only."""

    def __init__(
        self,
        acl: Acl | None,
        *,
        brokers_by_certificate: bool,
        max_clock_skew_ms: int,
        own_group: str | None = None,
        now_s: Callable[[], float],
        rules: Mapping[str, Rule] = RULES,
    ) -> None:
        self.acl = acl
        self.brokers_by_certificate = brokers_by_certificate
        self.max_clock_skew_s = max_clock_skew_ms / 1000
        self.own_group = own_group
        self.now_s = now_s
        self.rules = rules

    def check(self, method: str, caller: Caller, request: Any) -> Who:
        who = self.authenticate(caller)
        self.authorize(method, who, request)
        return who

    # ------------------------------------------------------------------ who
    def authenticate(self, caller: Caller) -> Who:
        broker = _broker(caller.certificate_name)
        if broker is not None:
            return Who(broker=broker)
        acl = self.acl
        if acl is None:
            return Who()
        header = caller.metadata.get(signing.AUTHORIZATION_KEY, "")
        try:
            auth = signing.parse_authorization(header) if header else None
        except signing.SignatureFormatError as e:
            raise _unauthenticated("malformed", f"malformed credentials: {e}") from None
        if auth is None or not auth.access_key:
            if acl.globally_white_listed(caller.ip):
                return Who(white_listed=True)
            raise _unauthenticated(
                "no_credentials", "the request carries no credentials (access key and signature)"
            )
        account = acl.accounts.get(auth.access_key)
        if account is None:
            # The caller's text, echoed in the log and the answer: cut to a sane length.
            raise _unauthenticated("unknown_key", f"unknown access key {auth.access_key[:64]!r}")
        if account.white_listed(caller.ip) or acl.globally_white_listed(caller.ip):
            return Who(account=account)
        date_time = caller.metadata.get(signing.DATE_TIME_KEY, "")
        try:
            signed_at = signing.parse_date_time(date_time)
        except signing.SignatureFormatError as e:
            raise _unauthenticated("malformed", f"access key {account.access_key!r}: {e}") from None
        skew = abs(self.now_s() - signed_at)
        if skew > self.max_clock_skew_s:
            raise _unauthenticated(
                "stale_date",
                f"access key {account.access_key!r}: the request is dated {date_time}, "
                f"{skew:.0f} s from the server's clock (at most {self.max_clock_skew_s:.0f} s)",
            )
        if not auth.verifies(account.secret_key, date_time):
            raise _unauthenticated(
                "bad_signature",
                f"access key {account.access_key!r}: the signature does not match "
                "(a wrong secret key)",
            )
        return Who(account=account)

    # ------------------------------------------------------------------ may they
    def authorize(self, method: str, who: Who, request: Any) -> None:
        rule = self.rules.get(method)
        if rule is None:
            raise _denied("denied", f"{method} has no permission rule; it is refused to everyone")
        if rule is Kind.CLUSTER:
            self._cluster(method, who, request)
            return
        if who.broker is not None or who.white_listed or self.acl is None:
            return
        account = who.account
        assert account is not None  # authenticate() found one when there is an ACL
        if account.admin or rule is Kind.AUTHENTICATED:
            return
        if rule is Kind.ADMIN:
            raise _denied(
                "denied", f"access key {account.access_key!r}: {_name(method)} is for admins"
            )
        assert callable(rule)
        for need in rule(request):
            self._grant(method, account, need)

    def _grant(self, method: str, account: Account, need: Need) -> None:
        ak = account.access_key
        if need.kind == "admin":
            raise _denied("denied", f"access key {ak!r}: this {_name(method)} is for admins")
        granted = (
            account.topic_perm(need.name) if need.kind == "topic" else account.group_perm(need.name)
        )
        if not granted & need.perm:
            raise _denied(
                "denied",
                f"access key {ak!r} may not {need.perm.describe()} {need.kind} {need.name!r} "
                f"({_name(method)}; it has {granted.describe()})",
            )

    def _cluster(self, method: str, who: Who, request: Any) -> None:
        broker = who.broker
        if broker is None:
            if not self.brokers_by_certificate and who.account is not None and who.account.admin:
                return  # a cluster without mutual TLS: brokers call with admin credentials
            if not self.brokers_by_certificate and self.acl is None:
                return
            raise _denied(
                "not_a_broker",
                f"{_name(method)} is for the cluster's brokers: {who} presented no broker "
                "certificate",
            )
        claimed = _claimed_identity(method, request)
        if claimed is not None:
            name, broker_id = claimed
            # A master under automatic failover registers as id 0 whatever its own id is.
            if name != broker.name or broker_id not in (broker.broker_id, 0):
                raise _denied(
                    "wrong_identity",
                    f"broker {broker} may not act as {broker_certificate_name(name, broker_id)}",
                )
        elif self.own_group is not None and broker.name != self.own_group:
            raise _denied(
                "wrong_identity",
                f"broker {broker} is not a member of group {self.own_group!r} "
                f"({_name(method)} is for its own members)",
            )

    def replication_peer(self, who: Who, name: str, broker_id: int) -> None:
        """A slave's handshake names the broker it is: it must be the certificate's."""
        broker = who.broker
        if broker is None:
            if self.brokers_by_certificate:
                raise _denied("not_a_broker", "replication is for brokers with a certificate")
            return
        if (name, broker_id) != (broker.name, broker.broker_id):
            raise _denied(
                "wrong_identity",
                f"broker {broker} may not replicate as {broker_certificate_name(name, broker_id)}",
            )


def _broker(certificate_name: str | None) -> BrokerPeer | None:
    if not certificate_name:
        return None
    m = BROKER_NAME_RE.match(certificate_name)
    return BrokerPeer(m.group(1), int(m.group(2))) if m else None


def _claimed_identity(method: str, request: Any) -> tuple[str, int] | None:
    """The broker a registration names, for the methods whose request names one."""
    if method.endswith("/RegisterBroker"):
        identity = request.broker.identity
    elif method.endswith("/UnregisterBroker"):
        identity = request.identity
    else:
        return None
    return identity.broker_name, int(identity.broker_id)


def _name(method: str) -> str:
    return method.rsplit("/", 1)[-1]
