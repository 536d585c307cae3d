"""The nameserver's ZooKeeper backend without ZooKeeper: routes rebuilt from znode snapshots,
its configuration and its command-line flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.services.nameserver import server, zk_format, zk_settings
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    BrokerRole,
    DataVersion,
    TopicQueues,
)
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.services.nameserver.zk_registry import ZooKeeperRegistryConfig
from tidemq.services.nameserver.zk_routes import BrokerZnode, build_route_table
from tidemq.services.nameserver.zk_settings import ZooKeeperConfigError

pytestmark = pytest.mark.unit

SESSION = 0x1234


def znode(
    address: str,
    broker_id: int = 0,
    *,
    name: str = "broker-a",
    cluster: str = "DefaultCluster",
    czxid: int = 1,
    mtime_ms: int = 1_000,
    epoch: int = 0,
    topics: tuple[str, ...] = ("orders",),
    owner: int = SESSION,
) -> BrokerZnode:
    host, port = address.rsplit(":", 1)
    reg = BrokerRegistration(
        cluster=cluster,
        broker_name=name,
        broker_id=broker_id,
        address=address,
        ha_address=f"{host}:{int(port) + 1}",
        role=BrokerRole.SYNC_MASTER if broker_id == 0 else BrokerRole.SLAVE,
        epoch=epoch,
        data_version=DataVersion(epoch, 1, 0),
        topics=tuple(TopicQueues(t, 8, 8, 6) for t in topics),
    )
    return BrokerZnode(
        cluster=cluster,
        broker_name=name,
        broker_id=str(broker_id),
        data=zk_format.encode_registration(reg),
        czxid=czxid,
        mtime_ms=mtime_ms,
        ephemeral_owner=owner,
    )


def view(table: RouteTable) -> tuple[object, ...]:
    return (table.cluster_info(), [table.route(t) for t in table.topics()])


def addresses(table: RouteTable, topic: str) -> dict[str, dict[int, str]]:
    route = table.route(topic)
    assert route is not None
    return {b.broker_name: b.addresses for b in route.brokers}


def test_routes_and_last_update_times_come_from_the_znodes() -> None:
    table, problems = build_route_table(
        [
            znode("10.0.0.1:10911", czxid=1, mtime_ms=5_000),
            znode("10.0.0.2:10911", 1, czxid=2, mtime_ms=6_000, topics=()),
            znode("10.0.0.3:10911", name="broker-b", czxid=3, topics=("orders", "pay")),
        ]
    )
    assert problems == {}
    assert addresses(table, "orders") == {
        "broker-a": {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"},
        "broker-b": {0: "10.0.0.3:10911"},
    }
    assert addresses(table, "pay") == {"broker-b": {0: "10.0.0.3:10911"}}
    (cluster,) = table.cluster_info()
    assert [b.last_update_ms for b in cluster.brokers] == [5_000, 6_000, 1_000]


def test_a_group_without_its_master_serves_reads_from_its_slaves_copies_of_the_topics() -> None:
    # The master's znode expired; its slaves copied its topics (config sync) into theirs.
    table, problems = build_route_table(
        [
            znode("10.0.0.3:10911", 2, czxid=1, topics=("orders", "stale")),
            znode("10.0.0.2:10911", 1, czxid=2, topics=("orders",)),
            znode("10.0.0.4:10911", name="broker-b", czxid=3, topics=("pay",)),
            znode("10.0.0.5:10911", 1, name="broker-b", czxid=4, topics=("ignored",)),
        ]
    )
    assert problems == {}
    assert addresses(table, "orders") == {"broker-a": {1: "10.0.0.2:10911", 2: "10.0.0.3:10911"}}
    assert table.topics() == ["orders", "pay"]  # the lowest slave's copy; masters' topics win


ZNODES = [
    znode("10.0.0.1:10911", czxid=10),
    znode("10.0.0.2:10911", 1, czxid=11, epoch=2),  # follows a master of epoch 2
    znode("10.0.0.9:10911", name="broker-e", czxid=12),  # claims the address of ...
    znode("10.0.0.9:10911", name="broker-b", czxid=13),  # ... this newer znode
    znode("10.0.0.4:10911", name="broker-c", cluster="Other", czxid=14),
    znode("10.0.0.5:10911", name="broker-c", czxid=15),  # broker-c is Other's already
    znode("10.0.0.6:10911", name="broker-d", czxid=16, topics=("orders", "logs")),
    znode("10.0.0.7:10911", 2, name="broker-d", czxid=17),
]


@settings(max_examples=50, deadline=None)
@given(st.permutations(ZNODES))
def test_the_same_znodes_give_the_same_routes_in_any_order(znodes: list[BrokerZnode]) -> None:
    """What makes any number of nameservers answer identically."""
    table, problems = build_route_table(znodes)
    expected_table, expected_problems = build_route_table(ZNODES)
    assert view(table) == view(expected_table)
    assert problems == expected_problems


def test_conflicts_are_settled_by_creation_order_and_epochs() -> None:
    table, problems = build_route_table(ZNODES)
    # The stale master (epoch 0 < its group's 2) is fenced: only its slave is left in broker-a.
    assert addresses(table, "logs") == {"broker-d": {0: "10.0.0.6:10911", 2: "10.0.0.7:10911"}}
    (default, other) = table.cluster_info()  # sorted by cluster name
    assert [g.broker_name for g in default.groups] == ["broker-a", "broker-b", "broker-d"]
    assert [g.broker_name for g in other.groups] == ["broker-c"]
    broker_a = default.groups[0]
    assert (broker_a.addresses, broker_a.epoch) == ({1: "10.0.0.2:10911"}, 2)
    assert addresses(table, "orders")["broker-b"] == {0: "10.0.0.9:10911"}
    assert sorted(problems) == [
        "DefaultCluster/broker-a/0",
        "DefaultCluster/broker-c/0",
        "DefaultCluster/broker-e/0",
    ]
    assert "claimed by a newer znode" in problems["DefaultCluster/broker-e/0"]
    assert "epoch 0" in problems["DefaultCluster/broker-a/0"]
    assert "belongs to cluster 'Other'" in problems["DefaultCluster/broker-c/0"]


def test_the_older_of_two_znodes_with_one_address_is_reported() -> None:
    older = znode("10.0.0.9:10911", czxid=1)
    newer = znode("10.0.0.9:10911", name="broker-b", czxid=2)
    table, problems = build_route_table([newer, older])
    assert table.lookup("10.0.0.9:10911") is not None
    assert table.route("orders") is not None
    assert problems == {
        "DefaultCluster/broker-a/0": "address 10.0.0.9:10911 is claimed by a newer znode"
    }


def test_bad_znodes_are_left_out_with_the_reason() -> None:
    good = znode("10.0.0.1:10911")
    bad = [
        dataclasses.replace(znode("10.0.0.2:10911", name="broker-b"), data=b"{"),
        dataclasses.replace(znode("10.0.0.3:10911", name="broker-c"), broker_id="00"),
        znode("10.0.0.4:10911", name="broker-d", owner=0),
        dataclasses.replace(znode("10.0.0.5:10911", name="broker-e"), broker_name="broker-f"),
    ]
    table, problems = build_route_table([good, *bad])
    assert addresses(table, "orders") == {"broker-a": {0: "10.0.0.1:10911"}}
    assert table.broker_count() == 1
    assert problems.keys() == {
        "DefaultCluster/broker-b/0",
        "DefaultCluster/broker-c/00",
        "DefaultCluster/broker-d/0",
        "DefaultCluster/broker-f/0",
    }
    assert "not JSON" in problems["DefaultCluster/broker-b/0"]
    assert "not a broker id" in problems["DefaultCluster/broker-c/00"]
    assert "not ephemeral" in problems["DefaultCluster/broker-d/0"]
    assert "znode is DefaultCluster/broker-f/0" in problems["DefaultCluster/broker-f/0"]


def test_no_znodes_no_routes() -> None:
    table, problems = build_route_table([])
    assert (table.broker_count(), table.topics(), problems) == (0, [], {})


# -- configuration and flags ------------------------------------------------------------------


def test_registry_config_is_checked_once() -> None:
    config = ZooKeeperRegistryConfig("zk1:2181,zk2:2181", "/mq", 4_000)
    assert (config.root, config.session_timeout_ms) == ("/mq", 4_000)
    for bad in (
        {"hosts": "zk1:2181,"},
        {"hosts": "zk1:2181", "root": "mq"},
        {"hosts": "zk1:2181", "session_timeout_ms": 10},
    ):
        with pytest.raises(ZooKeeperConfigError):
            ZooKeeperRegistryConfig(**bad)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_choose_the_registry() -> None:
    embedded, zk = server._configs(parse("--broker-expiry-ms", "1500"), None)
    assert zk is None and embedded is not None and embedded.broker_expiry_ms == 1500
    embedded, zk = server._configs(parse("--zk", "zk1:2181", "--zk-root", "/mq"), None)
    assert embedded is None
    assert zk == ZooKeeperRegistryConfig("zk1:2181", "/mq", zk_settings.DEFAULT_SESSION_TIMEOUT_MS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--zk-root", "/x"), "need --zk"),
        (("--zk-session-timeout-ms", "4000"), "need --zk"),
        (("--zk", "zk1:2181", "--broker-expiry-ms", "5000"), "embedded registry"),
        (("--zk", "zk1:2181", "--scan-interval-ms", "5000"), "embedded registry"),
        (("--zk", "not a host"), "ZooKeeper hosts"),
        (("--zk", "zk1:2181", "--zk-root", "relative"), "absolute path"),
        (("--zk", "zk1:2181", "--zk-session-timeout-ms", "100"), "session timeout"),
        (("--zk", "zk1:2181", "--zk-tls"), "--zk-tls needs this nameserver's TLS"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert server.run(parse("--listen", "127.0.0.1:0", *argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidemq nameserver: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1
