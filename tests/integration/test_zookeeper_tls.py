"""ZooKeeper over TLS (docs/security.md): with ``--zk-tls`` brokers and nameservers speak TLS to
ZooKeeper's secure client port with their own certificates, so a registry whose server requires
client certificates serves them; a client without a certificate the CA signed, or without TLS,
gets nothing from it."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.zk_registry import create_topic, route_of
from tests.integration.zookeeper import StartZooKeeper, ZooKeeperTls
from tests.tls_certs import Issued, TestCA
from tests.waiting import wait_until
from tidemq.protos.tls import TlsSettings
from tidemq.services.nameserver import zk_format

pytestmark = pytest.mark.integration

ROOT = "/tidemq-tls"
_QUIET = logging.getLogger("tests.zookeeper_tls.refused")
_QUIET.setLevel(logging.CRITICAL)


def tls_flags(cert: Issued, ca: TestCA) -> tuple[str, ...]:
    return (
        "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
        "--tls-ca-file", ca.ca_file,
    )  # fmt: skip


def connects(hosts: str, **tls: object) -> bool:
    """Whether a kazoo client with these settings gets a session within a few seconds.

    kazoo leaves the socket of a refused TLS handshake unclosed (its ``create_tcp_connection``
    wraps it, and the handshake's error skips the close) and logs the refusal with a traceback
    that holds it. Here the refusals are what is checked: the log is not kept, and the sockets'
    ResourceWarnings are kazoo's, collected inside the check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        client = KazooClient(hosts=hosts, timeout=3, logger=_QUIET, **tls)
        try:
            client.start(timeout=4)
        except KazooTimeoutError:
            return False
        finally:
            client.stop()
            client.close()
            del client
            gc.collect()
    return True


def test_brokers_and_nameservers_register_over_tls_and_clients_without_a_certificate_get_nothing(
    tmp_path: Path,
    start_zookeeper: StartZooKeeper,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ca = TestCA(tmp_path / "pki")
    zk = start_zookeeper(
        tls=ZooKeeperTls(ca.ca_file, ca.issue("zookeeper"), ca.issue("zk-operator"))
    )
    client = TlsSettings(ca_file=ca.ca_file)
    zk_flags = ("--zk", zk.hosts, "--zk-root", ROOT, "--zk-tls")
    ns = start_nameserver(*zk_flags, *tls_flags(ca.issue("nameserver"), ca), tls=client)
    broker = start_broker(
        "--broker-name", "broker-a", *zk_flags, *tls_flags(ca.issue("broker:broker-a:0"), ca),
        tls=client,
    )  # fmt: skip
    create_topic(broker, "orders")
    wait_until(lambda: route_of(ns, "orders") is not None, 30, "the nameserver to route it")
    assert route_of(ns, "orders") == {"broker-a": {0: broker.address}}
    with zk.client() as operator:  # the registration is in ZooKeeper, written over TLS
        path = zk_format.node_path(ROOT, "DefaultCluster", "broker-a", 0)
        assert operator.exists(path) is not None

    # A client the CA never signed for, or one without TLS, gets no session at all.
    assert not connects(zk.hosts)
    assert not connects(zk.hosts, use_ssl=True, ca=ca.ca_file, check_hostname=True)
    stranger = TestCA(tmp_path / "other-pki", "another CA").issue("broker:broker-a:0")
    assert not connects(
        zk.hosts, use_ssl=True, ca=ca.ca_file, certfile=stranger.cert_file,
        keyfile=stranger.key_file,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (("broker", "--zk", "127.0.0.1:2181", "--zk-tls"), "zk_tls needs the broker's TLS"),
        (("broker", "--zk-tls"), "zk_tls needs ZooKeeper"),
        (("nameserver", "--zk", "127.0.0.1:2181", "--zk-tls"), "--zk-tls needs this nameserver"),
    ],
)
def test_zk_tls_without_the_processes_tls_stops_it_with_the_reason(
    tmp_path: Path, command: tuple[str, ...], message: str
) -> None:
    args = [sys.executable, "-m", "tidemq.cli", *command]
    if command[0] == "broker":
        args += ["--store", str(tmp_path / "store")]
    else:
        args += ["--listen", "127.0.0.1:0"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert message in done.stderr
