"""The official RocketMQ 5 clients, unmodified, with credentials over TLS (docs/security.md): the
Python and the Node.js client sign their requests with an account of the broker's ACL file and
reach its RocketMQ 5 listener over TLS, trusting the cluster's CA the way gRPC lets any client
trust a private CA (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH); the same client with a wrong secret key is
refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import tidemq
from tests.integration.accounts import OPS, broker_config_as_ops, write_acl
from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.official_clients import (  # noqa: F401 - the fixtures
    client_fixture,
    of,
    programs_fixture,
    sent_ids,
)
from tests.interop.clients import Programs
from tests.tls_certs import Issued, TestCA
from tests.waiting import wait_until
from tidemq.protos.tls import TlsSettings

pytestmark = pytest.mark.integration


def _tls(cert: Issued, ca: TestCA) -> tuple[str, ...]:
    return (
        "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
        "--tls-ca-file", ca.ca_file,
    )  # fmt: skip


@dataclass
class Secured:
    broker: BrokerProcess
    admin: tidemq.Admin
    ca: TestCA

    def plan(self, secret_key: str = "app-secret", **fields: object) -> dict[str, object]:
        return {
            "endpoints": self.broker.rocketmq_address,
            "tls": True,
            "access_key": "app",
            "secret_key": secret_key,
            **fields,
        }

    @property
    def env(self) -> dict[str, str]:
        return {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": self.ca.ca_file}


@pytest.fixture
def secured(
    tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> Iterator[Secured]:
    ca = TestCA(tmp_path / "pki")
    acl = write_acl(tmp_path)
    tls = TlsSettings(ca_file=ca.ca_file)
    ns = start_nameserver(
        *_tls(ca.issue("nameserver"), ca), "--acl-file", str(acl), tls=tls, credentials=OPS
    )
    config = broker_config_as_ops(tmp_path)
    broker = start_broker(
        "--config", str(config), "--nameserver", ns.address, "--acl-file", str(acl),
        "--register-interval-ms", "500", *_tls(ca.issue("broker:broker-a:0"), ca),
        rocketmq=True, tls=tls, credentials=OPS,
    )  # fmt: skip
    with tidemq.Admin(ns.address, tls=tls, credentials=OPS) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "the broker registered over TLS")
        admin.create_topic("orders", queues=2)
        admin.update_consumer_group("billing")
        yield Secured(broker, admin, ca)


def test_official_client_with_credentials_over_tls_and_a_wrong_secret_refused(
    secured: Secured, programs: Programs
) -> None:
    consumer = programs.start(
        "simple_consumer",
        secured.plan(
            group="billing", topic="orders", await_s=2,
            rounds=[{"count": 3, "invisible_s": 30, "ack": True, "timeout_s": 40}],
        ),
        secured.env,
    )  # fmt: skip
    consumer.wait_for(
        "the group's queues",
        lambda _: len(secured.admin.receive_state("billing", "orders").queues) == 2,
        30,
    )
    messages = [{"body": f"order-{i}"} for i in range(3)]
    ids = sent_ids(
        programs.run("producer", secured.plan(topic="orders", messages=messages), env=secured.env)
    )
    assert sorted(ids) == ["order-0", "order-1", "order-2"]
    consumer.wait_for("its end", lambda p: p.proc.poll() is not None, 60)
    events = consumer.finish()
    assert sorted(m["body"] for m in of(events, "received")) == sorted(ids)
    assert sorted(a["message_id"] for a in of(events, "acked")) == sorted(ids.values())

    refused = programs.start(
        "producer",
        secured.plan(
            secret_key="not-the-secret", topic="orders", messages=[{"body": "intruder"}],
            request_timeout_s=2,
        ),
        secured.env,
    )  # fmt: skip
    refused.wait_for("its end", lambda p: p.proc.poll() is not None, 60)
    assert not refused.of("sent")
    wait_until(
        lambda: "'app': the signature does not match" in secured.broker.log(),
        10,
        "the broker to log the refusal",
    )
    # Nothing of the refused client was stored: the topic holds the three messages only.
    assert sum(q.max_offset for q in secured.admin.queue_status("orders")) == 3
