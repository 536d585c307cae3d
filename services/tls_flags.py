"""The TLS flags every server takes (``tidemq nameserver``, ``tidemq broker``), and the warning a
server gives when it listens beyond loopback in plaintext (docs/security.md)."""

from __future__ import annotations

import argparse
import ipaddress
import logging

from tidemq.protos.tls import CLIENT_AUTH_MODES, ServerTls

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert-file",
        metavar="PATH",
        help="serve TLS with this PEM certificate (chain); re-read when the file changes",
    )
    parser.add_argument("--tls-key-file", metavar="PATH", help="the certificate's PEM key")
    parser.add_argument(
        "--tls-ca-file",
        metavar="PATH",
        help="PEM CA certificates: which client certificates to accept, and (on a broker) which "
        "servers to trust when it calls nameservers and its master",
    )
    parser.add_argument(
        "--tls-client-auth",
        choices=CLIENT_AUTH_MODES,
        help="require: only clients with a certificate the CA signed (mutual TLS); default none",
    )


def from_args(args: argparse.Namespace) -> ServerTls | None:
    """The flags as a checked ``ServerTls`` (TlsConfigError when they cannot work), or None."""
    return ServerTls.from_settings(
        args.tls_cert_file or "",
        args.tls_key_file or "",
        args.tls_ca_file or "",
        args.tls_client_auth or "",
    )


def is_loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, or 0.0.0.0 / [::]: reachable from elsewhere


def warn_if_exposed(what: str, listen: str, tls: ServerTls | None, acl_file: str) -> None:
    """A loud warning for a listener other machines can reach in plaintext, or that lets
    anyone who reaches it do anything."""
    if not listen or is_loopback(listen):
        return
    if tls is None:
        log.warning(
            "SECURITY: %s listens on %s in plaintext: anyone on the network can read and change "
            "what it serves. Give it --tls-cert-file/--tls-key-file (docs/security.md).",
            what,
            listen,
        )
    if not acl_file and not (tls is not None and tls.client_auth == "require"):
        log.warning(
            "SECURITY: %s listens on %s without an ACL file: anyone who can reach it may do "
            "anything (delete topics, read every message). Give it --acl-file "
            "(docs/security.md).",
            what,
            listen,
        )
