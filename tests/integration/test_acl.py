"""Authentication and permissions on real processes (docs/security.md): every RPC of every
service, enumerated from the descriptors, refused without credentials, with a bad signature,
with a stale date and without the permission, and let through with the right account; fuzzed
authorization headers; the SDK and the CLI with credentials; the ACL file re-read."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tidemq
from tests.integration.accounts import (
    ACL,
    APP,
    NOBODY,
    OPS,
    broker_config_as_ops,
    write_acl,
)
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, nameserver_pb2, replication_pb2, signing
from tidemq.protos.rocketmq import service_pb2
from tidemq.services.auth.rules import RULES, Kind


@dataclass
class Secured:
    nameserver: NameServerProcess
    broker: BrokerProcess
    acl_path: Path
    metrics: str
    nameserver_metrics: str

    def targets(self) -> Iterator[tuple[str, Any]]:
        """(address, service descriptor) of every service the two processes serve."""
        for module, address in (
            (nameserver_pb2, self.nameserver.address),
            (broker_pb2, self.broker.address),
            (replication_pb2, self.broker.address),
            (service_pb2, self.broker.rocketmq_address),
        ):
            for service in module.DESCRIPTOR.services_by_name.values():
                yield address, service


@pytest.fixture
def secured(
    tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> Secured:
    acl_path = write_acl(tmp_path)
    ns_metrics = f"127.0.0.1:{free_port()}"
    ns = start_nameserver(
        "--acl-file", str(acl_path), "--metrics-listen", ns_metrics, credentials=OPS
    )  # fmt: skip
    # The broker signs its registrations as ops (secret_key in its config file).
    config = broker_config_as_ops(tmp_path)
    metrics = f"127.0.0.1:{free_port()}"
    broker = start_broker(
        "--config", str(config), "--nameserver", ns.address, "--acl-file", str(acl_path),
        "--register-interval-ms", "500", "--metrics-listen", metrics,
        rocketmq=True, credentials=OPS,
    )  # fmt: skip
    with tidemq.Admin(ns.address, credentials=OPS) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "the broker registered with credentials")
        admin.create_topic("orders", queues=2)
        admin.create_topic("secret", queues=2)
    return Secured(ns, broker, acl_path, metrics, ns_metrics)


def _request(descriptor: Any, depth: int = 0) -> Any:
    """A request naming topic "orders" and group "billing" wherever it names one (in nested
    messages too: one element of each repeated message field)."""
    request = message_factory.GetMessageClass(descriptor)()
    _fill(request, depth)
    return request


def _fill(message: Any, depth: int) -> None:
    for f in message.DESCRIPTOR.fields:
        value = "billing" if f.name in ("group", "producer_group") else "orders"
        if f.type == f.TYPE_STRING and f.name in (
            "topic",
            "block_topic",
            "group",
            "producer_group",
        ):
            if not f.is_repeated:
                setattr(message, f.name, value)
        elif f.message_type is not None and depth < 3 and not f.message_type.GetOptions().map_entry:
            if f.is_repeated:
                _fill(getattr(message, f.name).add(), depth + 1)
            elif f.name in ("topic", "group") and "name" in f.message_type.fields_by_name:
                getattr(message, f.name).name = value
            elif f.containing_oneof is None:
                _fill(getattr(message, f.name), depth + 1)


def _call(address: str, method: Any, metadata: list[tuple[str, str]]) -> str:
    """The status name a call ends with ("OK" if it answered), whatever its kind."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    request = _request(method.input_type).SerializeToString()
    with grpc.insecure_channel(address) as channel:
        try:
            if method.client_streaming:
                call = channel.stream_stream(path)(iter(()), metadata=metadata, timeout=2)
                for _ in call:
                    pass
            elif method.server_streaming:
                for _ in channel.unary_stream(path)(request, metadata=metadata, timeout=2):
                    pass
            else:
                channel.unary_unary(path)(request, metadata=metadata, timeout=5)
        except grpc.RpcError as e:
            return str(e.code().name)
    return "OK"


def _signed(creds: signing.Credentials, at: float | None = None) -> list[tuple[str, str]]:
    return list(creds.metadata(time.time() if at is None else at))


REFUSALS = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def test_every_rpc_refuses_the_unknown_and_the_unpermitted_and_admits_the_permitted(
    secured: Secured,
) -> None:
    wrong_secret = signing.Credentials("app", "not-the-secret")
    checked = 0
    for address, service in secured.targets():
        for method in service.methods:
            name = f"/{service.full_name}/{method.name}"
            rule = RULES[name]
            assert _call(address, method, []) == "UNAUTHENTICATED", name
            assert _call(address, method, _signed(wrong_secret)) == "UNAUTHENTICATED", name
            stale = _signed(APP, time.time() - 3600)
            assert _call(address, method, stale) == "UNAUTHENTICATED", name
            if rule is not Kind.AUTHENTICATED:
                assert _call(address, method, _signed(NOBODY)) == "PERMISSION_DENIED", name
            # The right account: an admin for what is for admins (and, in a cluster without
            # mutual TLS, for the cluster's own calls); the app for what it was given.
            right = OPS if rule in (Kind.ADMIN, Kind.CLUSTER) else APP
            assert _call(address, method, _signed(right)) not in REFUSALS, name
            checked += 1
    assert checked == len(RULES)
    # Every refusal is counted in the metrics of the server that refused it, by method and
    # reason.
    on_ns = {n: r for n, r in RULES.items() if n.startswith("/tidemq.v1.NameServer/")}
    on_broker = [r for n, r in RULES.items() if n not in on_ns]
    assert _refusals(secured.metrics) == sum(3 + (r is not Kind.AUTHENTICATED) for r in on_broker)
    expected = sum(3 + (r is not Kind.AUTHENTICATED) for r in on_ns.values())
    assert _refusals(secured.nameserver_metrics) == expected


def _refusals(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tidemq_auth_refusals_total{")
    )


def test_fuzzed_authorization_headers_are_refused_and_never_crash_a_server(
    secured: Secured,
) -> None:
    rng = random.Random(20261201)
    # Printable ASCII only: gRPC's client refuses anything else in a header value itself.
    alphabet = "MQv2-HMAC-SHA1 Credential=app,SignedHeaders=x-mq-date-time;Signature=0f" + (
        string.printable.strip()
    )
    method = broker_pb2.DESCRIPTOR.services_by_name["Broker"].methods_by_name["PullMessage"]
    route = nameserver_pb2.DESCRIPTOR.services_by_name["NameServer"].methods_by_name["QueryRoute"]
    for i in range(150):
        header = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
        if i % 3 == 0:
            header = "MQv2-HMAC-SHA1 " + header
        date = "".join(rng.choice("0123456789TZ") for _ in range(rng.randrange(0, 20)))
        metadata = [("authorization", header), ("x-mq-date-time", date)]
        assert _call(secured.broker.address, method, metadata) == "UNAUTHENTICATED", header
        assert _call(secured.nameserver.address, route, metadata) == "UNAUTHENTICATED", header
    for address in (secured.broker.address, secured.nameserver.address):
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert secured.broker.proc.poll() is None and secured.nameserver.proc.poll() is None


def test_the_sdk_and_the_cli_with_credentials_and_typed_refusals_without(
    secured: Secured,
) -> None:
    ns = secured.nameserver.address
    with tidemq.Producer(ns, credentials=APP) as producer:
        assert all(producer.send("orders", f"m{i}".encode()).ok for i in range(20))
        with pytest.raises(tidemq.errors.PermissionDeniedError, match=r"'app'.*topic 'secret'"):
            producer.send("secret", b"x")
    with tidemq.Consumer(
        ns, group="billing", topic="orders", start_from="first", credentials=APP
    ) as consumer:
        got: list[bytes] = []

        def all_consumed() -> bool:
            got.extend(m.body for m in consumer.poll(64, timeout_s=0.5))
            return len(got) >= 20

        wait_until(all_consumed, 30, "20 messages consumed with credentials")
    wrong = signing.Credentials("app", "not-the-secret")
    with (
        tidemq.Producer(ns, credentials=wrong, send_timeout_ms=3000) as producer,
        pytest.raises(tidemq.errors.AuthenticationError, match="signature does not match"),
    ):
        producer.send("orders", b"x")

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    cli = [sys.executable, "-m", "tidemq.cli", "topic", "list", "--nameserver", ns]

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=60, check=False,
            env={**env, **extra_env},
        )  # fmt: skip

    listed = run("--access-key", "ops", "--secret-key", "ops-secret")
    assert listed.returncode == 0 and "orders" in listed.stdout, listed.stderr
    listed = run(TIDEMQ_ACCESS_KEY="ops", TIDEMQ_SECRET_KEY="ops-secret")
    assert listed.returncode == 0 and "orders" in listed.stdout, listed.stderr
    denied = run("--access-key", "app", "--secret-key", "app-secret")
    assert denied.returncode == 1 and "ACCESS_DENIED" in denied.stderr
    assert "app-secret" not in denied.stderr


def test_a_changed_acl_file_applies_without_a_restart_and_a_broken_one_is_ignored(
    secured: Secured,
) -> None:
    ns = secured.nameserver.address
    with tidemq.Producer(ns, credentials=NOBODY, send_timeout_ms=3000) as producer:
        with pytest.raises(tidemq.errors.PermissionDeniedError):
            producer.send("orders", b"x")
        secured.acl_path.write_text(ACL + "    topicPerms:\n      - orders=PUB\n")
        wait_until(
            lambda: _sends(producer), 15, "the broker and nameserver to read the changed ACL"
        )
        secured.acl_path.write_text("accounts: [{accessKey: broken}]")
        # The servers look at the file when calls come; meanwhile the last good ACL holds.
        wait_until(
            lambda: _sends(producer) and "keeping the last good one" in secured.broker.log(),
            15,
            "the broker to notice the broken file",
        )
        assert "needs accessKey and secretKey" in secured.broker.log()


def _sends(producer: tidemq.Producer) -> bool:
    try:
        return producer.send("orders", b"now allowed").ok
    except tidemq.errors.PermissionDeniedError:
        return False
