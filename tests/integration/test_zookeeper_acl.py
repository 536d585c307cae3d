"""ZooKeeper with ACLs (docs/security.md): a broker given ``--zk-auth`` writes its registration
(and every znode it creates) as its digest identity; nameservers still read the registry without
credentials, and a client without the identity cannot change or fake a registration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.zk_registry import SESSION_MS, create_topic, route_of, zk_flags
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.services.nameserver import zk_format

pytestmark = pytest.mark.integration


def _client(zk: ZooKeeperServer, digest: str | None = None) -> KazooClient:
    client = KazooClient(
        hosts=zk.hosts, auth_data=[("digest", digest)] if digest else None, timeout=10
    )
    client.start(timeout=10)
    return client


def test_a_client_without_the_brokers_identity_cannot_change_or_fake_registrations(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    secret = tmp_path / "zk-auth"
    secret.write_text("digest:tidemq-brokers:s3cret\n")
    ns = start_nameserver(*zk_flags(zookeeper, zk_root))
    broker = start_broker(
        "--broker-name", "broker-a", *zk_flags(zookeeper, zk_root),
        "--zk-session-timeout-ms", str(SESSION_MS), "--zk-auth", f"@{secret}",
    )  # fmt: skip
    create_topic(broker, "orders")
    wait_until(lambda: route_of(ns, "orders") is not None, 20, "the nameserver to route it")

    path = zk_format.node_path(zk_root, "DefaultCluster", "broker-a", 0)
    group = path.rsplit("/", 1)[0]
    anonymous = _client(zookeeper)
    stranger = _client(zookeeper, "someone:else")
    owner = _client(zookeeper, "tidemq-brokers:s3cret")
    try:
        data, _ = anonymous.get(path)  # reading is open: nameservers need no credentials
        assert data
        for client in (anonymous, stranger):
            with pytest.raises(NoAuthError):
                client.set(path, b"{}")
            with pytest.raises(NoAuthError):
                client.delete(path)
            with pytest.raises(NoAuthError):  # a fake member of the group
                client.create(f"{group}/1", b"{}", ephemeral=True)
        assert anonymous.get(path)[0] == data
        assert route_of(ns, "orders") == {"broker-a": {0: broker.address}}
        # The identity itself may (the broker's own session is that identity).
        owner.set(path, data)
    finally:
        for client in (anonymous, stranger, owner):
            client.stop()
            client.close()


def test_an_unusable_zk_auth_stops_the_broker_with_the_reason(
    zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "tidemq.cli", "broker", "--store", str(tmp_path / "s"),
            *zk_flags(zookeeper, zk_root), "--zk-auth", "sasl:someone",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "zk_auth must be digest:USER:PASSWORD" in done.stderr
