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
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.integration.replicas import create_topic, max_offset
from tests.tls_certs import Issued, TestCA
from tests.waiting import wait_until
from tests.workers import Worker
from tidemq.protos import common_pb2, nameserver_pb2, nameserver_pb2_grpc, replication_pb2
from tidemq.protos.tls import TlsSettings, sync_channel


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki")


def server_flags(cert: Issued, ca: TestCA, client_auth: str = "none") -> tuple[str, ...]:
    return (
        "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
        "--tls-ca-file", ca.ca_file, "--tls-client-auth", client_auth,
    )  # fmt: skip


def group_flags(nameserver: str) -> tuple[str, ...]:
    return ("--nameserver", nameserver, "--broker-name", "group-a", "--register-interval-ms", "500")


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


def mutual_tls_group(
    ca: TestCA, start_nameserver: StartNameServer, start_broker: StartBroker, *master_flags: str
) -> tuple[TlsSettings, NameServerProcess, BrokerProcess, BrokerProcess]:
    """A nameserver, master and slave of group-a, all requiring client certificates (each broker
    with its own ``broker:group-a:<id>`` certificate), topic "orders" created; and the settings
    of a client with its own certificate ("app")."""
    app = ca.issue("app")
    client = TlsSettings(ca.ca_file, app.cert_file, app.key_file)
    ns = start_nameserver(*server_flags(ca.issue("nameserver"), ca, "require"), tls=client)
    group = group_flags(ns.address)
    master = start_broker(
        *group, *master_flags,
        *server_flags(ca.issue("broker:group-a:0"), ca, "require"), store="master", tls=client,
    )  # fmt: skip
    create_topic(master)
    slave = start_broker(
        *group, "--role", "SLAVE", "--broker-id", "1", "--config-sync-interval-ms", "300",
        *server_flags(ca.issue("broker:group-a:1"), ca, "require"), store="slave", tls=client,
    )  # fmt: skip
    return client, ns, master, slave


def test_mutual_tls_admits_only_certificates_the_ca_signed_and_replicates_over_it(
    ca: TestCA, tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    client, ns, master, slave = mutual_tls_group(ca, start_nameserver, start_broker)

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
    first = ca.issue("broker:group-a:0", stem="master-v1")
    live = tmp_path / "live"
    live.mkdir()
    _rotate(first, live)
    served = Issued(str(live / "tls.crt"), str(live / "tls.key"))
    group = group_flags(ns.address)
    master = start_broker(*group, *server_flags(served, ca), store="master", tls=client)
    create_topic(master)
    slave = start_broker(
        *group, "--role", "SLAVE", "--broker-id", "1", "--config-sync-interval-ms", "300",
        *server_flags(ca.issue("broker:group-a:1"), ca), store="slave", tls=client,
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
        second = ca.issue("broker:group-a:0", stem="master-v2")
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


def _replicate_as(address: str, tls: TlsSettings, name: str, broker_id: int) -> str:
    """Open a replication stream claiming to be ``name``/``broker_id``: the status it ends
    with ("" if the master accepted the handshake)."""
    hello = replication_pb2.SlaveMessage(
        handshake=replication_pb2.Handshake(
            cluster="DefaultCluster", broker_name=name, broker_id=broker_id,
            commitlog_file_size=1 << 20, empty=True, address="127.0.0.1:1",
        )
    )  # fmt: skip
    with sync_channel(address, tls) as channel:
        stream = channel.stream_stream(
            "/tidemq.v1.Replication/Stream",
            request_serializer=replication_pb2.SlaveMessage.SerializeToString,
            response_deserializer=replication_pb2.MasterMessage.FromString,
        )
        call = stream(iter([hello]), timeout=5)
        try:
            first = next(call)
        except grpc.RpcError as e:
            return str(e.code().name)
        call.cancel()
        assert first.WhichOneof("kind") == "accepted", first
        return ""


def test_impersonating_brokers_are_refused_and_the_real_slave_keeps_its_link(
    ca: TestCA, start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    client, ns, master, slave = mutual_tls_group(
        ca, start_nameserver, start_broker, "--role", "SYNC_MASTER"
    )
    wait_until(lambda: max_offset(slave) == max_offset(master), 30, "the slave to connect")

    def holding(cn: str) -> TlsSettings:
        cert = ca.issue(cn)
        return TlsSettings(ca.ca_file, cert.cert_file, cert.key_file)

    # A valid certificate of another member, of another group, and of a client: none may
    # replicate as the real slave (or evict it).
    assert _replicate_as(master.address, holding("broker:group-a:2"), "group-a", 1) == (
        "PERMISSION_DENIED"
    )
    assert _replicate_as(master.address, holding("broker:group-b:1"), "group-a", 1) == (
        "PERMISSION_DENIED"
    )
    assert _replicate_as(master.address, client, "group-a", 1) == "PERMISSION_DENIED"
    assert _replicate_as(master.address, TlsSettings(ca.ca_file), "group-a", 1) == "UNAVAILABLE"
    # Nor register in its place.
    register = nameserver_pb2.RegisterBrokerRequest(
        broker=common_pb2.BrokerInfo(
            identity=common_pb2.BrokerIdentity(
                cluster="DefaultCluster", broker_name="group-a", broker_id=1
            ),
            address="127.0.0.1:1",
            ha_address="127.0.0.1:1",
        )
    )
    for stranger in (holding("broker:group-a:3"), client):
        with sync_channel(ns.address, stranger) as channel, pytest.raises(grpc.RpcError) as e:
            nameserver_pb2_grpc.NameServerStub(channel).RegisterBroker(register, timeout=5)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert any(
            why in (e.value.details() or "")
            for why in ("may not act as broker:group-a:1", "presented no broker certificate")
        ), e.value.details()

    # The real slave still holds its link and acknowledges SYNC_MASTER sends.
    with tidemq.Producer(ns.address, tls=client) as producer:
        assert all(producer.send("orders", f"m{i}".encode()).ok for i in range(20))
    end = max_offset(master)
    wait_until(lambda: max_offset(slave) == end, 30, "the slave to hold every message")
    assert slave.log().count("replicating from") == 1, slave.log()
    route = ns.stub().QueryRoute(nameserver_pb2.QueryRouteRequest(topic="orders"), timeout=5)
    [group_a] = route.brokers
    assert dict(group_a.addresses) == {0: master.address, 1: slave.address}
    # Logged once per kind of refusal per 10 s: the impersonation and the client's certificate.
    log = master.log()
    assert "broker broker:group-a:2 may not replicate as broker:group-a:1" in log
    assert "Stream is for the cluster's brokers" in log
