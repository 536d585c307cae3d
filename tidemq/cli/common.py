"""What every client command shares: the ``--nameserver`` and TLS flags, and JSON output."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from tidemq._runtime import DEFAULT_NAMESERVER, NAMESERVER_ENV
from tidemq.protos import signing, tls

# flag dest -> the variable every client of the process reads when its tls= is left as None.
_TLS_FLAGS = {
    "client_tls_ca_file": tls.ENV_CA_FILE,
    "client_tls_cert_file": tls.ENV_CERT_FILE,
    "client_tls_key_file": tls.ENV_KEY_FILE,
    "client_tls_server_name": tls.ENV_SERVER_NAME,
    "client_access_key": signing.ENV_ACCESS_KEY,
    "client_secret_key": signing.ENV_SECRET_KEY,
}


def add_nameserver(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nameserver",
        metavar="HOST:PORT[,...]",
        help=f"nameserver address(es) (default ${NAMESERVER_ENV} or {DEFAULT_NAMESERVER})",
    )
    add_tls(p)
    add_credentials(p)


def add_credentials(p: argparse.ArgumentParser) -> None:
    """A client command's credentials; each defaults to its TIDEMQ_* variable."""
    g = p.add_argument_group("credentials (docs/security.md)")
    g.add_argument(
        "--access-key",
        dest="client_access_key",
        metavar="KEY",
        help=f"sign requests as this account (${signing.ENV_ACCESS_KEY})",
    )
    g.add_argument(
        "--secret-key",
        dest="client_secret_key",
        metavar="SECRET",
        help=f"the account's secret key (${signing.ENV_SECRET_KEY}; the variable keeps it out "
        "of the process list)",
    )


def add_tls(p: argparse.ArgumentParser) -> None:
    """A client command's TLS flags; each defaults to its TIDEMQ_TLS_* variable."""
    g = p.add_argument_group("TLS (docs/security.md)")
    g.add_argument(
        "--tls",
        dest="client_tls",
        action="store_true",
        default=None,
        help=f"connect over TLS, trusting the system's CAs (${tls.ENV_TLS}=1)",
    )
    g.add_argument(
        "--tls-ca-file",
        dest="client_tls_ca_file",
        metavar="PATH",
        help=f"connect over TLS, trusting this PEM CA (${tls.ENV_CA_FILE})",
    )
    g.add_argument(
        "--tls-cert-file",
        dest="client_tls_cert_file",
        metavar="PATH",
        help=f"client certificate for servers that require one (${tls.ENV_CERT_FILE})",
    )
    g.add_argument(
        "--tls-key-file",
        dest="client_tls_key_file",
        metavar="PATH",
        help=f"the client certificate's key (${tls.ENV_KEY_FILE})",
    )
    g.add_argument(
        "--tls-server-name",
        dest="client_tls_server_name",
        metavar="NAME",
        help=f"the name the servers' certificates carry, when not the host dialled "
        f"(${tls.ENV_SERVER_NAME})",
    )


def export_tls(args: argparse.Namespace) -> None:
    """Hand the TLS and credential flags to every client this command makes, as the variables
    they read."""
    for dest, env in _TLS_FLAGS.items():
        value = getattr(args, dest, None)
        if value:
            os.environ[env] = value
    if getattr(args, "client_tls", None):
        os.environ[tls.ENV_TLS] = "1"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
