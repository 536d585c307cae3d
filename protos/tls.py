"""TLS for tidemq's connections (docs/security.md): a server's certificate, re-read when its files
change, and a client's trust and optional certificate.

A server (``ServerTls``) presents ``cert_file``/``key_file`` (PEM; the certificate file may hold
the chain). With ``client_auth="require"`` (mutual TLS) it accepts only clients whose certificate
``ca_file`` signed. gRPC asks for the server's certificate before every new handshake; the files
are stat'ed then and re-read when one changed (cert-manager and Kubernetes rotate Secrets by
swapping files), so a rotated certificate applies to new connections without a restart, and
established connections keep theirs. A half-rotated pair (a new certificate beside the old key)
is not taken: the server keeps the last good pair, logs why, and looks again at the next
handshake.

A client (``TlsSettings``) trusts ``ca_file`` (the system's roots without it) and, for mutual TLS,
presents ``cert_file``/``key_file``; it reads them when it opens a channel, so a client's rotated
certificate applies to its next channels. ``TlsSettings.from_env()`` reads
``TIDEMQ_TLS_CA_FILE``, ``TIDEMQ_TLS_CERT_FILE``, ``TIDEMQ_TLS_KEY_FILE`` and
``TIDEMQ_TLS_SERVER_NAME`` (and ``TIDEMQ_TLS=1`` for TLS on the system's roots alone).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidemq.protos.signing import Credentials, SigningInterceptor, SyncSigningInterceptor

log = logging.getLogger(__name__)

# gRPC's Python server offers two of OpenSSL's client certificate modes: not asking for one, or
# requiring one that the CA signed.
CLIENT_AUTH_MODES = ("none", "require")

ENV_TLS = "TIDEMQ_TLS"
ENV_CA_FILE = "TIDEMQ_TLS_CA_FILE"
ENV_CERT_FILE = "TIDEMQ_TLS_CERT_FILE"
ENV_KEY_FILE = "TIDEMQ_TLS_KEY_FILE"
ENV_SERVER_NAME = "TIDEMQ_TLS_SERVER_NAME"


class TlsConfigError(ValueError):
    """TLS settings that cannot work: a missing or unreadable file, a certificate that is not
    PEM, a key that does not match its certificate. Not retriable: the files must be fixed."""

    retriable = False


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsConfigError(f"{what} {path!r}: cannot read it: {e.strerror}") from None


def _check_pair(cert_file: str, key_file: str) -> None:
    """The certificate is PEM and the key is its key (OpenSSL's own check, through ``ssl``)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as e:
        raise TlsConfigError(
            f"certificate {cert_file!r} and key {key_file!r} are not a PEM certificate and its "
            f"private key: {e.reason or e}"
        ) from None
    except OSError as e:
        raise TlsConfigError(
            f"certificate {cert_file!r} or key {key_file!r}: cannot read it: {e.strerror}"
        ) from None


def _check_ca(ca: bytes, ca_file: str) -> None:
    try:
        ssl.create_default_context(cadata=ca.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
        raise TlsConfigError(f"CA file {ca_file!r} holds no PEM certificate: {e}") from None


def _check_readable(*paths: str) -> None:
    for path in paths:
        if path and not os.access(path, os.R_OK):
            raise TlsConfigError(f"TLS file {path!r} does not exist or cannot be read")


def _stamp(path: str) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten; ``stat`` follows the symlinks a
    Kubernetes Secret volume swaps."""
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    ca_file: str = ""
    client_auth: str = "none"

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH_MODES:
            raise TlsConfigError(
                f"tls client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}, "
                f"got {self.client_auth!r}"
            )
        if not self.cert_file or not self.key_file:
            raise TlsConfigError("TLS needs both a certificate file and a key file")
        if self.client_auth == "require" and not self.ca_file:
            raise TlsConfigError("tls client_auth require needs a CA file (tls_ca_file)")
        _check_readable(self.cert_file, self.key_file, self.ca_file)
        # Unusable files are a configuration error at start, not a failure of every handshake.
        _check_pair(self.cert_file, self.key_file)
        if self.ca_file:
            _check_ca(_read(self.ca_file, "CA file"), self.ca_file)

    @classmethod
    def from_settings(
        cls, cert_file: str, key_file: str, ca_file: str, client_auth: str
    ) -> ServerTls | None:
        """None when no TLS setting is given; a checked ``ServerTls`` otherwise."""
        if not (cert_file or key_file or ca_file) and client_auth in ("", "none"):
            return None
        return cls(cert_file, key_file, ca_file, client_auth or "none")

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that re-read the files when they change; raises
        ``TlsConfigError`` now when the files are unusable."""
        reloader = CertificateReloader(self)
        return grpc.dynamic_ssl_server_credentials(
            reloader.initial,
            reloader.fetch,
            require_client_authentication=self.client_auth == "require",
        )

    def as_client(self) -> TlsSettings:
        """A server's own certificate as a client's: a broker calls nameservers and its master
        with the certificate it serves with, and trusts the same CA."""
        return TlsSettings(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)


class CertificateReloader:
    """The server's certificate configuration, re-read from its files when they change. Called
    by gRPC before each handshake, from its threads."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._stamps, self.initial = self._load()
        self.reloads = 0

    def _paths(self) -> tuple[str, ...]:
        t = self.tls
        return (t.cert_file, t.key_file, t.ca_file) if t.ca_file else (t.cert_file, t.key_file)

    def _load(self) -> tuple[tuple[tuple[int, int, int], ...], grpc.ServerCertificateConfiguration]:
        t = self.tls
        stamps = tuple(self._stamp_or_raise(p) for p in self._paths())
        _check_pair(t.cert_file, t.key_file)
        cert = _read(t.cert_file, "certificate")
        key = _read(t.key_file, "key")
        ca = None
        if t.ca_file:
            ca = _read(t.ca_file, "CA file")
            _check_ca(ca, t.ca_file)
        if tuple(self._stamp_or_raise(p) for p in self._paths()) != stamps:
            # Changed while being read: what was read may be half of each; the next look retries.
            raise TlsConfigError("the certificate files changed while they were read")
        config = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
        return stamps, config

    @staticmethod
    def _stamp_or_raise(path: str) -> tuple[int, int, int]:
        try:
            return _stamp(path)
        except OSError as e:
            raise TlsConfigError(f"{path!r}: cannot read it: {e.strerror}") from None

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when the files changed, None to keep the current one."""
        with self._lock:
            try:
                if tuple(_stamp(p) for p in self._paths()) == self._stamps:
                    return None
                stamps, config = self._load()
            except (OSError, TlsConfigError) as e:
                # Mid-rotation (the certificate replaced, the key not yet) or a broken file: keep
                # serving with the last good pair rather than failing every handshake.
                log.warning("TLS certificate not reloaded, keeping the current one: %s", e)
                return None
            self._stamps = stamps
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.tls.cert_file)
            return config


@dataclass(frozen=True)
class TlsSettings:
    """A client's TLS: the CA it trusts (empty: the system's roots), and its own certificate and
    key for servers that require one. ``server_name`` overrides the name the server's
    certificate must carry (by default the host of the address dialled)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise TlsConfigError("a client certificate needs both cert_file and key_file")
        _check_readable(self.ca_file, self.cert_file, self.key_file)
        if self.cert_file:
            _check_pair(self.cert_file, self.key_file)
        if self.ca_file:
            _check_ca(_read(self.ca_file, "CA file"), self.ca_file)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsSettings | None:
        """From ``TIDEMQ_TLS_*``; None when none is set (plaintext)."""
        env = os.environ if environ is None else environ
        names = (ENV_CA_FILE, ENV_CERT_FILE, ENV_KEY_FILE, ENV_SERVER_NAME)
        values = [env.get(n, "") for n in names]
        enabled = env.get(ENV_TLS, "").lower() in ("1", "true", "yes", "on")
        if not any(values) and not enabled:
            return None
        return cls(*values)

    def credentials(self) -> grpc.ChannelCredentials:
        """The files as they are now (checked when the settings were made: a pair caught in
        the middle of a rotation fails that one handshake, retried as any unreachable server)."""
        ca = _read(self.ca_file, "CA file") if self.ca_file else None
        key = cert = None
        if self.cert_file:
            cert = _read(self.cert_file, "certificate")
            key = _read(self.key_file, "key")
        return grpc.ssl_channel_credentials(ca, key, cert)

    def channel_options(self) -> list[tuple[str, Any]]:
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def resolve(tls: TlsSettings | bool | None) -> TlsSettings | None:
    """A client's ``tls=`` argument: settings, True (the system's roots), False (plaintext
    whatever the environment says) or None (the environment decides)."""
    if tls is None:
        return TlsSettings.from_env()
    if tls is True:
        return TlsSettings()
    if tls is False:
        return None
    if not isinstance(tls, TlsSettings):
        raise TypeError(f"tls must be TlsSettings, a bool or None, not {type(tls).__name__}")
    return tls


def aio_channel(
    address: str,
    tls: TlsSettings | None,
    options: Sequence[tuple[str, Any]] = (),
    credentials: Credentials | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: over TLS with ``tls``, plaintext without; every call
    signed with ``credentials`` when given (``signing``)."""
    interceptors = [SigningInterceptor(credentials)] if credentials is not None else None
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(
        address,
        tls.credentials(),
        options=[*options, *tls.channel_options()],
        interceptors=interceptors,
    )


def sync_channel(
    address: str,
    tls: TlsSettings | None,
    options: Sequence[tuple[str, Any]] = (),
    credentials: Credentials | None = None,
) -> grpc.Channel:
    """A blocking channel to ``address``: over TLS with ``tls``, plaintext without; every call
    signed with ``credentials`` when given."""
    if tls is None:
        channel = grpc.insecure_channel(address, options=list(options))
    else:
        channel = grpc.secure_channel(
            address, tls.credentials(), options=[*options, *tls.channel_options()]
        )
    if credentials is None:
        return channel
    return grpc.intercept_channel(channel, SyncSigningInterceptor(credentials))


def add_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> int:
    """Bind ``address``: with TLS when the server has it. The bound port (0 when it failed)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, tls.credentials()))
