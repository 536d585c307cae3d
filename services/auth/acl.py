"""Accounts and their permissions, read from an ACL file in RocketMQ 4's ``plain_acl.yml``
format, so RocketMQ users bring theirs::

    globalWhiteRemoteAddresses:      # requests from these addresses need no credentials
      - 10.10.103.*
    accounts:
      - accessKey: app
        secretKey: 12345678
        whiteRemoteAddress: 192.168.1.*  # from here, this key's requests need no signature
        admin: false
        defaultTopicPerm: DENY         # topics not listed below
        defaultGroupPerm: SUB          # consumer groups not listed below
        topicPerms:
          - orders=PUB|SUB
          - audit=SUB
        groupPerms:
          - billing=SUB

A permission is ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``; a default left out is ``DENY``. A
topic named ``%RETRY%<group>`` or ``%DLQ%<group>`` is the group's: its group permission applies.
An admin account may do anything. A white-listed address skips what RocketMQ skips (a global
one: the credentials; an account's: the signature) but, unlike RocketMQ 4, an account still has
only its own permissions. Addresses: ``*``, an IP, ``10.1.*``-style wildcards, a last-part range
``192.168.1.10-20`` or set ``192.168.1.{1,2}``, or a CIDR block ``10.0.0.0/8``.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


class AclFileError(ValueError):
    """An ACL file that cannot be read or does not describe accounts; it names the problem.
    A server refuses to start with one and keeps its last good ACL when a reload finds one."""

    retriable = False


class Perm(enum.Flag):
    DENY = 0
    PUB = enum.auto()
    SUB = enum.auto()

    @classmethod
    def parse(cls, text: str, where: str) -> Perm:
        parts = {p.strip().upper() for p in str(text).split("|") if p.strip()}
        if parts == {"DENY"}:
            return cls.DENY
        if not parts or not parts <= {"PUB", "SUB"}:
            raise AclFileError(f"{where}: permission {text!r} is not DENY, PUB, SUB or PUB|SUB")
        perm = cls.DENY
        for p in parts:
            perm |= cls[p]
        return perm

    def describe(self) -> str:
        return "|".join(str(p.name) for p in (Perm.PUB, Perm.SUB) if p in self) or "DENY"


class AddressPattern:
    """One white-list entry, matched against a peer's IP."""

    _WILDCARD = re.compile(r"^(\d{1,3}|\*)(\.(\d{1,3}|\*)){0,3}\.?\Z")

    def __init__(self, text: str, where: str) -> None:
        self.text = text = str(text).strip()
        self._network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
        self._parts: list[set[int] | None] | None = None
        if text in ("*", "*.*.*.*"):
            self._parts = [None, None, None, None]
            return
        try:
            self._network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            pass
        else:
            return
        parts = text.rstrip(".").split(".")
        if len(parts) > 4:
            raise AclFileError(f"{where}: address {text!r} is not an address pattern")
        parsed: list[set[int] | None] = []
        for i, part in enumerate(parts):
            parsed.append(self._part(part, text, where, last=i == len(parts) - 1))
        # "10.1.*" and "10.1." cover everything below the parts given.
        parsed += [None] * (4 - len(parsed))
        if len(parts) < 4 and parsed[len(parts) - 1] is not None and not text.endswith("."):
            raise AclFileError(
                f"{where}: address {text!r} has fewer than four parts and no trailing * or ."
            )
        self._parts = parsed

    @staticmethod
    def _part(part: str, text: str, where: str, *, last: bool) -> set[int] | None:
        bad = AclFileError(f"{where}: address {text!r} is not an address pattern")
        if part == "*":
            return None
        if last and part.startswith("{") and part.endswith("}"):
            values = part[1:-1].split(",")
        elif last and "-" in part:
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise bad
            values = [str(v) for v in range(int(lo), int(hi) + 1)]
        else:
            values = [part]
        out = set()
        for value in values:
            v = value.strip()
            if not v.isdigit() or int(v) > 255:
                raise bad
            out.add(int(v))
        return out

    def matches(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if self._network is not None:
            return addr in self._network
        if addr.version != 4:
            return False
        assert self._parts is not None
        octets = [int(o) for o in str(addr).split(".")]
        return all(p is None or o in p for p, o in zip(self._parts, octets, strict=True))

    def __repr__(self) -> str:
        return f"AddressPattern({self.text!r})"


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    white_addresses: tuple[AddressPattern, ...] = ()
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = field(default_factory=dict)
    group_perms: Mapping[str, Perm] = field(default_factory=dict)

    def topic_perm(self, topic: str) -> Perm:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if topic.startswith(prefix):
                return self.group_perm(topic[len(prefix) :])
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        return self.group_perms.get(group, self.default_group_perm)

    def white_listed(self, ip: str) -> bool:
        return any(p.matches(ip) for p in self.white_addresses)


@dataclass(frozen=True)
class Acl:
    accounts: Mapping[str, Account]
    global_white_addresses: tuple[AddressPattern, ...] = ()

    def globally_white_listed(self, ip: str) -> bool:
        return any(p.matches(ip) for p in self.global_white_addresses)


def _addresses(value: Any, where: str) -> tuple[AddressPattern, ...]:
    if value is None or value == "":
        return ()
    items = value if isinstance(value, list) else [value]
    return tuple(AddressPattern(str(v), where) for v in items if str(v).strip())


def _perm_list(value: Any, where: str) -> dict[str, Perm]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise AclFileError(f"{where} must be a list of NAME=PERM")
    out = {}
    for item in value:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            raise AclFileError(f"{where}: {item!r} is not NAME=PERM")
        out[name.strip()] = Perm.parse(perm, f"{where} {name.strip()}")
    return out


def _account(raw: Any, index: int) -> Account:
    where = f"accounts[{index}]"
    if not isinstance(raw, dict):
        raise AclFileError(f"{where} must be a mapping")
    ak, sk = raw.get("accessKey"), raw.get("secretKey")
    if not ak or not sk:
        raise AclFileError(f"{where} needs accessKey and secretKey")
    ak, sk = str(ak), str(sk)
    where = f"account {ak!r}"
    if len(sk) < 6:
        raise AclFileError(f"{where}: secretKey must be at least 6 characters")
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise AclFileError(f"{where}: admin must be true or false")
    return Account(
        access_key=ak,
        secret_key=sk,
        admin=admin,
        white_addresses=_addresses(raw.get("whiteRemoteAddress"), f"{where} whiteRemoteAddress"),
        default_topic_perm=Perm.parse(raw.get("defaultTopicPerm", "DENY"), f"{where} default"),
        default_group_perm=Perm.parse(raw.get("defaultGroupPerm", "DENY"), f"{where} default"),
        topic_perms=_perm_list(raw.get("topicPerms"), f"{where} topicPerms"),
        group_perms=_perm_list(raw.get("groupPerms"), f"{where} groupPerms"),
    )


def parse(text: str, source: str = "ACL file") -> Acl:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise AclFileError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise AclFileError(f"{source}: must be a mapping with 'accounts'")
    accounts_raw: Sequence[Any] = raw.get("accounts") or []
    if not isinstance(accounts_raw, list):
        raise AclFileError(f"{source}: 'accounts' must be a list")
    accounts: dict[str, Account] = {}
    try:
        for i, a in enumerate(accounts_raw):
            account = _account(a, i)
            if account.access_key in accounts:
                raise AclFileError(f"access key {account.access_key!r} appears twice")
            accounts[account.access_key] = account
        white = _addresses(raw.get("globalWhiteRemoteAddresses"), "globalWhiteRemoteAddresses")
    except AclFileError as e:
        raise AclFileError(f"{source}: {e}") from None
    return Acl(accounts, white)


def load(path: str) -> Acl:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise AclFileError(f"ACL file {path!r}: cannot read it: {e.strerror}") from None
    except UnicodeDecodeError:
        raise AclFileError(f"ACL file {path!r}: not UTF-8 text") from None
    return parse(text, f"ACL file {path!r}")
