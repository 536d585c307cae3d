"""Settings of a ZooKeeper registry, checked once: the hosts string, the root znode, the session
timeout and the digest identity (``--zk``, ``--zk-root``, ``--zk-session-timeout-ms``,
``--zk-auth``). The znodes themselves are ``zk_format``'s."""

from __future__ import annotations

import re

from tidemq.services.nameserver.servicer import parse_host_port

DEFAULT_ROOT = "/tidemq"
DEFAULT_ZK_PORT = 2181
DEFAULT_SESSION_TIMEOUT_MS = 10_000
SESSION_TIMEOUT_MIN_MS = 1_000
SESSION_TIMEOUT_MAX_MS = 600_000
ROOT_MAX_CHARS = 512

_COMPONENT_RE = re.compile(r"^[A-Za-z0-9._-]+\Z")


class ZooKeeperConfigError(ValueError):
    """A hosts string, root path, name or session timeout that ZooKeeper cannot take."""


def check_root(path: str) -> str:
    """``path`` if it can be the registry's root znode; ZooKeeperConfigError otherwise."""
    if not path.startswith("/"):
        raise ZooKeeperConfigError(f"root {path!r} must be an absolute path like /tidemq")
    if len(path) > ROOT_MAX_CHARS:
        raise ZooKeeperConfigError(f"root {path[:40]!r}... is longer than {ROOT_MAX_CHARS}")
    if path == "/":
        return path
    parts = path[1:].split("/")
    for part in parts:
        check_component(f"root {path!r}", part)
    if parts[0] == "zookeeper":
        raise ZooKeeperConfigError(f"root {path!r}: /zookeeper is ZooKeeper's own subtree")
    return path


def check_hosts(hosts: str) -> str:
    """``hosts`` if it is a ZooKeeper connect string, ``HOST[:PORT][,HOST[:PORT]...][/chroot]``
    (port 2181 when left out, IPv6 hosts in brackets); ZooKeeperConfigError otherwise."""
    servers, slash, chroot = hosts.partition("/")
    if not servers:
        raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: no HOST:PORT given")
    if slash:
        try:
            check_root(slash + chroot)
        except ZooKeeperConfigError as e:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: chroot: {e}") from None
    for entry in servers.split(","):
        if not entry:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: an empty entry")
        with_port = entry
        if entry.endswith("]") or ":" not in entry:
            with_port = f"{entry}:{DEFAULT_ZK_PORT}"
        try:
            parse_host_port(with_port)
        except ValueError as e:
            raise ZooKeeperConfigError(f"ZooKeeper hosts {hosts!r}: {e}") from None
    return hosts


def check_session_timeout_ms(value: int) -> int:
    """``value`` if it can be asked for as a session timeout; ZooKeeperConfigError otherwise."""
    if not SESSION_TIMEOUT_MIN_MS <= value <= SESSION_TIMEOUT_MAX_MS:
        raise ZooKeeperConfigError(
            f"ZooKeeper session timeout must be in [{SESSION_TIMEOUT_MIN_MS}, "
            f"{SESSION_TIMEOUT_MAX_MS}] ms, got {value} (the server further clamps it to "
            "[2, 20] x its tickTime)"
        )
    return value


def parse_auth(text: str) -> tuple[str, str]:
    """``digest:USER:PASSWORD``, or ``@PATH`` of a file holding it (a mounted Secret): the
    ZooKeeper digest identity a broker writes its znodes as (docs/security.md)."""
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise ZooKeeperConfigError(
                f"zk_auth file {path!r}: cannot read it: {e.strerror}"
            ) from None
    scheme, _, credential = text.partition(":")
    user, sep, password = credential.partition(":")
    if scheme != "digest" or not sep or not user or not password:
        raise ZooKeeperConfigError("zk_auth must be digest:USER:PASSWORD (or @FILE holding it)")
    return user, password


def check_component(what: str, name: str) -> None:
    # "." and ".." pass the name rules but are not znode names to ZooKeeper.
    if not _COMPONENT_RE.match(name) or name in (".", ".."):
        raise ZooKeeperConfigError(
            f"{what}: {name!r} is not a znode name of letters, digits, '.', '_' and '-'"
        )
