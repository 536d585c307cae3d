"""TLS on real nameserver and broker processes (docs/security.md): the SDK, the CLI, replication
and registration over TLS; plaintext and strangers refused; mutual TLS; certificates rotated
under load without a restart and without dropping the replication stream."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer, free_port
from tests.integration.replicas import create_topic, max_offset
from tests.tls_certs import Issued, TestCA
from tests.waiting import wait_until
from tests.workers import Worker
from tidemq.protos.tls import TlsSettings, sync_channel


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki")


def server_flags(cert: Issued, ca: TestCA, client_auth: str = "none") -> tuple[str, ...]:
    return (
        "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
        "--tls-ca-file", ca.ca_file, "--tls-client-auth", client_auth,
    )  # fmt: skip


def refused(address: str, tls: TlsSettings | None) -> str:
    """The status code of a health check that never reached the server ("" if it answered)."""
    with sync_channel(address, tls) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.RpcError as e:
            return str(e.code().name)
    return ""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_TLS")}
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_tls_cluster_serves_the_sdk_and_the_cli_and_refuses_plaintext_and_strangers(
    ca: TestCA, tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    client = TlsSettings(ca_file=ca.ca_file)
    ns = start_nameserver(*server_flags(ca.issue("nameserver"), ca), tls=client)
    broker = start_broker(
        "--nameserver", ns.address, "--auto-create-topics", "--register-interval-ms", "500",
        *server_flags(ca.issue("broker-a"), ca), tls=client,
    )  # fmt: skip

    with tidemq.Producer(ns.address, tls=client) as producer:
        sent = [producer.send("secure", f"m{i}".encode()) for i in range(50)]
    assert all(r.ok for r in sent)
    got: list[bytes] = []
    with tidemq.Consumer(
        ns.address, group="g", topic="secure", start_from="first", tls=client
    ) as consumer:

        def consumed_all() -> bool:
            got.extend(m.body for m in consumer.poll(64, timeout_s=0.5))
            return len(got) >= 50

        wait_until(consumed_all, 30, "50 messages consumed over TLS")
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(50))

    # The CLI: flags, or the variables the flags stand for.
    listed = cli("topic", "list", "--nameserver", ns.address, "--tls-ca-file", ca.ca_file)
    assert listed.returncode == 0, listed.stderr
    assert "secure" in listed.stdout
    healthy = cli("health", broker.address, "--tls-ca-file", ca.ca_file)
    assert healthy.returncode == 0 and "SERVING" in healthy.stdout, healthy.stdout
    plain = cli("health", broker.address)
    assert plain.returncode == 1 and "UNREACHABLE" in plain.stdout

    # Plaintext, and TLS trusting another CA, never reach a service.
    stranger = TestCA(tmp_path / "stranger", name="someone else's CA")
    for address in (ns.address, broker.address):
        assert refused(address, None) == "UNAVAILABLE"
        assert refused(address, TlsSettings(ca_file=stranger.ca_file)) == "UNAVAILABLE"
    assert refused(broker.address, client) == ""


def test_mutual_tls_admits_only_certificates_the_ca_signed_and_replicates_over_it(
    ca: TestCA, tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    app = ca.issue("app")
    client = TlsSettings(ca.ca_file, app.cert_file, app.key_file)
    ns = start_nameserver(*server_flags(ca.issue("nameserver"), ca, "require"), tls=client)
    group = (
        "--nameserver",
        ns.address,
        "--broker-name",
        "group-a",
        "--register-interval-ms",
        "500",
    )
    master = start_broker(
        *group, *server_flags(ca.issue("group-a-0"), ca, "require"), store="master", tls=client
    )
    create_topic(master)
    slave = start_broker(
        *group, "--role", "SLAVE", "--broker-id", "1", "--config-sync-interval-ms", "300",
        *server_flags(ca.issue("group-a-1"), ca, "require"), store="slave", tls=client,
    )  # fmt: skip

    stranger = TestCA(tmp_path / "stranger", name="someone else's CA")
    foreign = stranger.issue("app")
    for address in (ns.address, master.address, slave.address):
        assert refused(address, TlsSettings(ca_file=ca.ca_file)) == "UNAVAILABLE"
        assert (
            refused(address, TlsSettings(ca.ca_file, foreign.cert_file, foreign.key_file))
            == "UNAVAILABLE"
        )
        assert refused(address, client) == ""

    # Registration (routes), the SDK, and the slave's replication and config sync all run over
    # mutual TLS with each broker's own certificate.
    with tidemq.Producer(ns.address, tls=client) as producer:
        futures = [producer.send_async("orders", b"x" * 512) for _ in range(2000)]
        assert all(f.result(timeout=60).ok for f in futures)
    end = max_offset(master)
    wait_until(lambda: max_offset(slave) == end, 60, "the slave to replicate over mutual TLS")


def _rotate(cert: Issued, live: Path) -> None:
    """Replace the served pair as a Secret update does: each file swapped whole (the key
    first, so that for a moment the certificate and key do not match)."""
    for src, name in ((cert.key_file, "tls.key"), (cert.cert_file, "tls.crt")):
        tmp = live / f".{name}.new"
        shutil.copyfile(src, tmp)
        os.replace(tmp, live / name)


def _served_certificate(address: str) -> bytes:
    """The DER certificate a new TLS connection to ``address`` is shown."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(cert: Issued) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(cert.cert_file).read_text())


def test_rotated_certificate_serves_new_connections_while_sends_and_replication_continue(
    ca: TestCA, tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    client = TlsSettings(ca_file=ca.ca_file)
    ns = start_nameserver(*server_flags(ca.issue("nameserver"), ca), tls=client)
    first = ca.issue("group-a-0", stem="master-v1")
    live = tmp_path / "live"
    live.mkdir()
    _rotate(first, live)
    served = Issued(str(live / "tls.crt"), str(live / "tls.key"))
    group = (
        "--nameserver",
        ns.address,
        "--broker-name",
        "group-a",
        "--register-interval-ms",
        "500",
    )
    master = start_broker(*group, *server_flags(served, ca), store="master", tls=client)
    create_topic(master)
    slave = start_broker(
        *group, "--role", "SLAVE", "--broker-id", "1", "--config-sync-interval-ms", "300",
        *server_flags(ca.issue("group-a-1"), ca), store="slave", tls=client,
    )  # fmt: skip
    assert _served_certificate(master.address) == _der(first)

    stop = threading.Event()
    results: list[tidemq.SendResult] = []

    def load() -> None:
        with tidemq.Producer(ns.address, tls=client) as producer:
            while not stop.is_set():
                futures = [producer.send_async("orders", b"y" * 256) for _ in range(200)]
                results.extend(f.result(timeout=60) for f in futures)

    loader = Worker(load, name="load")
    loader.start()
    try:
        wait_until(lambda: loader.check() and len(results) >= 1000, 60, "sends before rotation")
        wait_until(lambda: max_offset(slave) > 0, 30, "the slave to replicate")
        second = ca.issue("group-a-0", stem="master-v2")
        _rotate(second, live)
        wait_until(
            lambda: _served_certificate(master.address) == _der(second),
            30,
            "new connections to be shown the rotated certificate",
        )
        at_rotation = len(results)
        wait_until(
            lambda: loader.check() and len(results) >= at_rotation + 2000,
            60,
            "sends after rotation",
        )
    finally:
        stop.set()
    loader.finish()
    assert all(r.ok for r in results)
    end = max_offset(master)
    wait_until(lambda: max_offset(slave) == end, 60, "the slave to hold every message")
    # The slave's replication stream, established before the rotation, was never re-made.
    assert slave.log().count("replicating from") == 1, slave.log()
    assert "TLS certificate reloaded" in master.log()


def test_a_broker_with_unusable_tls_files_refuses_to_start_and_says_why(
    ca: TestCA, tmp_path: Path
) -> None:
    other = ca.issue("other")
    mine = ca.issue("broker-a")
    mismatched = cli(
        "broker", "--store", str(tmp_path / "store"), "--listen", f"127.0.0.1:{free_port()}",
        "--tls-cert-file", mine.cert_file, "--tls-key-file", other.key_file,
    )  # fmt: skip
    assert mismatched.returncode != 0
    assert "not a PEM certificate and its private key" in mismatched.stderr
    missing = cli(
        "nameserver", "--listen", "127.0.0.1:0",
        "--tls-cert-file", str(tmp_path / "absent.crt"), "--tls-key-file", mine.key_file,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "absent.crt" in missing.stderr
