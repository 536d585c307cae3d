"""What nameservers make of the registry in ZooKeeper: several nameservers on one ZooKeeper answer
byte for byte alike (and refuse heartbeats, typed); znodes they cannot use are skipped and
reported, never served; a slave registered only in ZooKeeper finds its master there.
"""

from __future__ import annotations

import json

import grpc
import pytest

from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.replicas import SLAVE_FLAGS, topic_names
from tests.integration.zk_registry import (
    CLUSTER,
    RPC_TIMEOUT_S,
    cluster_info,
    create_topic,
    query_route,
    route_of,
    routed_broker,
    start_zk_broker,
    status,
    typed_error,
    wire,
    zk_flags,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2

pytestmark = pytest.mark.integration


def test_nameservers_on_one_zookeeper_answer_identically(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    first = start_nameserver(*zk_flags(zookeeper, zk_root))
    second = start_nameserver(*zk_flags(zookeeper, zk_root))
    a = start_zk_broker(start_broker, zookeeper, zk_root, "broker-a")
    b = start_zk_broker(start_broker, zookeeper, zk_root, "broker-b")
    create_topic(a, "orders", queues=4)
    create_topic(b, "orders", queues=2)
    create_topic(a, "payments", queues=8)
    expected = {
        "orders": {"broker-a": {0: a.address}, "broker-b": {0: b.address}},
        "payments": {"broker-a": {0: a.address}},
    }

    def routed(ns: NameServerProcess) -> bool:
        return all(route_of(ns, topic) == want for topic, want in expected.items())

    wait_until(lambda: routed(first) and routed(second), 20, "both nameservers to route both")
    # A nameserver started later reads the same znodes and so answers the same.
    third = start_nameserver(*zk_flags(zookeeper, zk_root))
    wait_until(lambda: routed(third), 20, "the third nameserver to route both topics")

    orders = query_route(first, "orders")
    assert [
        (q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in orders.queues
    ] == [("broker-a", 4, 4, 6), ("broker-b", 2, 2, 6)]
    for topic in expected:
        answers = {wire(query_route(ns, topic)) for ns in (first, second, third)}
        assert len(answers) == 1, f"nameservers disagree on the route of {topic}"
    infos = [cluster_info(ns) for ns in (first, second, third)]
    assert len({wire(i) for i in infos}) == 1, "nameservers disagree on the cluster info"
    (cluster,) = infos[0].clusters
    assert [(x.broker.identity.broker_name, x.broker.address) for x in cluster.brokers] == [
        ("broker-a", a.address),
        ("broker-b", b.address),
    ]
    for ns in (first, second, third):
        s = status(ns)
        assert (s.registry, s.stale, s.brokers) == ("zookeeper", False, 2), s

    # Heartbeats are refused, typed and not retriable: a broker without --zk must find out.
    heartbeat = nameserver_pb2.RegisterBrokerRequest(
        broker=common_pb2.BrokerInfo(
            identity=common_pb2.BrokerIdentity(cluster=CLUSTER, broker_name="broker-c"),
            address="127.0.0.1:10911",
            role=common_pb2.ASYNC_MASTER,
        )
    )
    code, detail = typed_error(lambda: first.stub().RegisterBroker(heartbeat, timeout=5))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (detail.code, detail.retriable) == (common_pb2.INVALID_ARGUMENT, False)
    assert "--zk" in detail.message
    # Unregistering is accepted and changes nothing: the znode belongs to the broker's session.
    first.stub().UnregisterBroker(
        nameserver_pb2.UnregisterBrokerRequest(
            identity=common_pb2.BrokerIdentity(
                cluster=CLUSTER, broker_name="broker-a", broker_id=0
            ),
            address=a.address,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert route_of(first, "payments") == expected["payments"]


def test_invalid_znodes_are_skipped_and_reported(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, _ = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)
    route_before = wire(query_route(ns, "orders"))
    info_before = wire(cluster_info(ns))

    def registration(name: str, broker_id: int = 0, **changes: object) -> bytes:
        doc: dict[str, object] = {
            "format": 1,
            "cluster": CLUSTER,
            "broker_name": name,
            "broker_id": broker_id,
            "address": "127.0.0.1:1",
            "ha_address": "",
            "role": "ASYNC_MASTER",
            "epoch": 0,
            "data_version": {"state_version": 0, "counter": 0, "timestamp_ms": 0},
            "topics": [{"topic": "orders", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}],
        }
        doc.update(changes)
        return json.dumps(doc).encode()

    group = f"{zk_root}/clusters/{CLUSTER}"
    bad = {
        f"{group}/broker-x/0": b"{not json",
        f"{group}/broker-y/0": registration("broker-z"),  # names another broker than its path
        f"{group}/broker-w/1": registration("broker-w", 1),  # id 1 with a master role
        f"{group}/broker-v/0": registration("broker-v", format=3),
    }
    persistent = f"{group}/broker-p/0"
    with zookeeper.client() as client:
        for path, data in bad.items():
            client.create(path, data, ephemeral=True, makepath=True)
        client.create(persistent, registration("broker-p"), makepath=True)
        try:
            wait_until(
                lambda: "5 znode(s) skipped" in status(ns).detail,
                10,
                "the nameserver to skip the five bad znodes",
            )
            assert wire(query_route(ns, "orders")) == route_before
            assert wire(cluster_info(ns)) == info_before
            assert not status(ns).stale
            log = ns.log()
            for name in ("broker-x", "broker-y", "broker-w", "broker-v", "broker-p"):
                assert f"skipping znode {CLUSTER}/{name}/" in log
        finally:
            client.delete(persistent)
    # The test's session has ended: its ephemeral znodes are gone, and so are the complaints.
    wait_until(lambda: "skipped" not in status(ns).detail, 10, "the bad znodes to go")
    assert ns.proc.poll() is None


def test_slave_registered_only_in_zookeeper_finds_its_master_there(
    zookeeper: ZooKeeperServer, zk_root: str, start_broker: StartBroker
) -> None:
    master = start_zk_broker(start_broker, zookeeper, zk_root)
    master.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic="orders")),
        timeout=RPC_TIMEOUT_S,
    )
    slave = start_broker(
        *("--broker-name", "broker-a", *SLAVE_FLAGS),
        *zk_flags(zookeeper, zk_root),
        store="broker-a-s1",
    )
    msg = common_pb2.Message(topic="orders", body=b"through zookeeper")
    master.stub().SendMessage(broker_pb2.SendMessageRequest(messages=[msg]), timeout=RPC_TIMEOUT_S)

    def end(b: BrokerProcess) -> int:
        st = b.stub().GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=RPC_TIMEOUT_S)
        return int(st.store.commitlog_max_offset)

    wait_until(lambda: end(slave) == end(master) > 0, 30, "the slave to replicate via ZooKeeper")
    wait_until(lambda: "orders" in topic_names(slave), 30, "the master's topics on the slave")
