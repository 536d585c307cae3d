"""TLS settings without sockets: what servers and clients accept, the certificate reloader's
decisions as files change, the environment, and the plaintext-exposure warning."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from tests.tls_certs import Issued, TestCA
from tidemq.protos.tls import (
    CertificateReloader,
    ServerTls,
    TlsConfigError,
    TlsSettings,
    resolve,
)
from tidemq.services import tls_flags
from tidemq.services.broker.config import BrokerConfig
from tidemq.storage.errors import ConfigError


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def first(ca: TestCA) -> Issued:
    return ca.issue("broker-a", stem="first")


@pytest.fixture(scope="module")
def second(ca: TestCA) -> Issued:
    return ca.issue("broker-a", stem="second")


def test_server_tls_refuses_settings_that_cannot_work(
    ca: TestCA, first: Issued, second: Issued, tmp_path: Path
) -> None:
    with pytest.raises(TlsConfigError, match="client_auth must be one of none, require"):
        ServerTls(first.cert_file, first.key_file, ca.ca_file, "request-maybe")
    with pytest.raises(TlsConfigError, match="require needs a CA file"):
        ServerTls(first.cert_file, first.key_file, "", "require")
    with pytest.raises(TlsConfigError, match="both a certificate file and a key file"):
        ServerTls(first.cert_file, "")
    with pytest.raises(TlsConfigError, match=r"absent\.pem"):
        ServerTls(str(tmp_path / "absent.pem"), first.key_file)
    with pytest.raises(TlsConfigError, match="not a PEM certificate and its private key"):
        ServerTls(first.cert_file, second.key_file)
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    with pytest.raises(TlsConfigError, match="holds no PEM certificate"):
        ServerTls(first.cert_file, first.key_file, str(not_pem))
    assert TlsConfigError("x").retriable is False
    assert ServerTls.from_settings("", "", "", "") is None


def test_broker_config_names_a_bad_tls_file(first: Issued, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gone\.crt"):
        BrokerConfig(
            store_dir=str(tmp_path), tls_cert_file=str(tmp_path / "gone.crt"),
            tls_key_file=first.key_file,
        )  # fmt: skip
    cfg = BrokerConfig(
        store_dir=str(tmp_path), tls_cert_file=first.cert_file, tls_key_file=first.key_file
    )
    assert cfg.client_tls == TlsSettings(cert_file=first.cert_file, key_file=first.key_file)
    assert BrokerConfig(store_dir=str(tmp_path)).client_tls is None


def _serve_from(pair: Issued, live: Path) -> Issued:
    live.mkdir(exist_ok=True)
    shutil.copyfile(pair.cert_file, live / "tls.crt")
    shutil.copyfile(pair.key_file, live / "tls.key")
    return Issued(str(live / "tls.crt"), str(live / "tls.key"))


def _replace(src: str, dst: str) -> None:
    tmp = dst + ".new"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def test_reloader_takes_a_rotated_pair_and_ignores_a_half_rotated_one(
    ca: TestCA, first: Issued, second: Issued, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = _serve_from(first, tmp_path / "live")
    reloader = CertificateReloader(ServerTls(served.cert_file, served.key_file, ca.ca_file))
    assert reloader.fetch() is None  # nothing changed: keep the current configuration

    _replace(second.key_file, served.key_file)  # the key first: a moment of mismatch
    with caplog.at_level(logging.WARNING):
        assert reloader.fetch() is None
    assert "keeping the current one" in caplog.text
    assert reloader.reloads == 0

    _replace(second.cert_file, served.cert_file)
    assert reloader.fetch() is not None
    assert reloader.reloads == 1
    assert reloader.fetch() is None  # taken once

    os.remove(served.cert_file)  # a broken volume: keep serving with what works
    assert reloader.fetch() is None
    assert reloader.reloads == 1


def test_client_settings_from_the_environment_and_the_tls_argument(
    ca: TestCA, first: Issued
) -> None:
    assert TlsSettings.from_env({}) is None
    assert TlsSettings.from_env({"TIDEMQ_TLS": "1"}) == TlsSettings()
    assert TlsSettings.from_env({"TIDEMQ_TLS_CA_FILE": ca.ca_file}) == TlsSettings(ca.ca_file)
    env = {
        "TIDEMQ_TLS_CA_FILE": ca.ca_file,
        "TIDEMQ_TLS_CERT_FILE": first.cert_file,
        "TIDEMQ_TLS_KEY_FILE": first.key_file,
        "TIDEMQ_TLS_SERVER_NAME": "broker.example",
    }
    settings = TlsSettings.from_env(env)
    assert settings == TlsSettings(ca.ca_file, first.cert_file, first.key_file, "broker.example")
    assert settings.channel_options() == [("grpc.ssl_target_name_override", "broker.example")]
    with pytest.raises(TlsConfigError, match="needs both cert_file and key_file"):
        TlsSettings.from_env({"TIDEMQ_TLS_CERT_FILE": first.cert_file})
    with pytest.raises(TlsConfigError, match="cannot be read"):
        TlsSettings(ca_file="/nonexistent/ca.pem")

    assert resolve(True) == TlsSettings()
    assert resolve(False) is None
    assert resolve(settings) is settings
    with pytest.raises(TypeError, match="tls must be TlsSettings"):
        resolve("yes")  # type: ignore[arg-type]


def test_exposed_listeners_are_warned_about_and_loopback_ones_are_not(
    caplog: pytest.LogCaptureFixture, ca: TestCA, first: Issued
) -> None:
    served = ServerTls(first.cert_file, first.key_file)
    with caplog.at_level(logging.WARNING):
        for loopback in ("127.0.0.1:10911", "localhost:10911", "[::1]:10911"):
            tls_flags.warn_if_exposed("the broker", loopback, None, "")
        tls_flags.warn_if_exposed("the broker", "0.0.0.0:10911", served, "acl.yml")
    assert not caplog.records

    def warnings(listen: str, tls: ServerTls | None, acl_file: str) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            tls_flags.warn_if_exposed("the broker", listen, tls, acl_file)
        return [r.getMessage().split(" listens on ")[1] for r in caplog.records]

    plaintext, open_to_all = warnings("0.0.0.0:9876", None, "")
    assert plaintext.startswith("0.0.0.0:9876 in plaintext")
    assert open_to_all.startswith("0.0.0.0:9876 without an ACL file")
    [only] = warnings("broker-0.tidemq:10911", None, "acl.yml")
    assert only.startswith("broker-0.tidemq:10911 in plaintext")
    [only] = warnings("10.0.0.5:10911", served, "")
    assert only.startswith("10.0.0.5:10911 without an ACL file")


def test_a_rotation_in_progress_never_fails_the_brokers_own_calls(
    first: Issued, second: Issued, tmp_path: Path
) -> None:
    served = _serve_from(first, tmp_path / "live")
    cfg = BrokerConfig(
        store_dir=str(tmp_path), tls_cert_file=served.cert_file, tls_key_file=served.key_file
    )
    client = cfg.client_tls
    assert client is not None
    _replace(second.key_file, served.key_file)  # the key first: a moment of mismatch
    # Checked once with the config: the registration and sync rounds keep making channels.
    assert cfg.client_tls is client and cfg.tls is not None
    assert client.credentials() is not None
    with pytest.raises(TlsConfigError, match="not a PEM certificate and its private key"):
        TlsSettings(cert_file=served.cert_file, key_file=served.key_file)  # a new client's check
