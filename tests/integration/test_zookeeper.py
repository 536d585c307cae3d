"""Nameservers and brokers on a real ZooKeeper: real processes, real sessions, real expiry.

Brokers here ask for 4 s sessions (the server's tickTime is 500 ms), so a dead broker leaves the
routes within seconds; every wait is a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.replicas import topic_names
from tests.integration.zookeeper import StartZooKeeper, ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2
from tidemq.protos.errors import detail_from_metadata

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 5.0
SESSION_MS = 4_000
# ZooKeeper expires a session at its timeout rounded up to a tick, and then the nameserver needs
# a watch event and a read; generous for a loaded 2-core machine, still well below a clean stop's
# proof window (see test_clean_shutdown_leaves_the_routes_at_once).
EXPIRY_SLACK_S = 4.0
CLUSTER = "DefaultCluster"


def zk_flags(zk: ZooKeeperServer, root: str) -> tuple[str, ...]:
    return ("--zk", zk.hosts, "--zk-root", root)


def start_zk_broker(
    start_broker: StartBroker,
    zk: ZooKeeperServer,
    root: str,
    name: str = "broker-a",
    *,
    session_ms: int = SESSION_MS,
    port: int | None = None,
) -> BrokerProcess:
    return start_broker(
        "--broker-name",
        name,
        *zk_flags(zk, root),
        "--zk-session-timeout-ms",
        str(session_ms),
        store=name,
        port=port,
    )


def routed_broker(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    zk: ZooKeeperServer,
    root: str,
    *,
    session_ms: int = SESSION_MS,
) -> tuple[NameServerProcess, BrokerProcess]:
    """A nameserver and broker-a on ZooKeeper, once the nameserver routes its topic "orders"."""
    ns = start_nameserver(*zk_flags(zk, root))
    b = start_zk_broker(start_broker, zk, root, session_ms=session_ms)
    create_topic(b, "orders")
    wait_until(lambda: route_of(ns, "orders") is not None, 20, "the route of orders")
    return ns, b


def create_topic(b: BrokerProcess, topic: str, queues: int = 4) -> None:
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues
            )
        ),
        timeout=RPC_TIMEOUT_S,
    )


def query_route(ns: NameServerProcess, topic: str) -> Any:
    return ns.stub().QueryRoute(
        nameserver_pb2.QueryRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
    )


def route_of(ns: NameServerProcess, topic: str) -> dict[str, dict[int, str]] | None:
    """Broker name -> {id: address} for ``topic``, or None when no group serves it."""
    try:
        route = query_route(ns, topic)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
            return None
        raise
    return {b.broker_name: dict(b.addresses) for b in route.brokers}


def cluster_info(ns: NameServerProcess) -> Any:
    return ns.stub().GetClusterInfo(nameserver_pb2.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)


def status(ns: NameServerProcess) -> Any:
    return ns.stub().GetStatus(nameserver_pb2.GetStatusRequest(), timeout=RPC_TIMEOUT_S)


def typed_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, Any]:
    """The status and ErrorDetail of a call that must fail."""
    with pytest.raises(grpc.RpcError) as failure:
        call()
    error: Any = failure.value  # grpc's errors are also the Call, with code() and trailers
    detail = detail_from_metadata(error.trailing_metadata())
    assert detail is not None, "every error carries its typed detail"
    return error.code(), detail


def wire(message: Any) -> bytes:
    return bytes(message.SerializeToString(deterministic=True))


def znode_owner(zk: ZooKeeperServer, root: str, name: str, broker_id: int = 0) -> int:
    """The session owning a broker's znode; 0 when there is no znode."""
    with zk.client() as client:
        stat = client.exists(f"{root}/clusters/{CLUSTER}/{name}/{broker_id}")
    return 0 if stat is None else int(stat.ephemeralOwner)


def send_one(b: BrokerProcess, topic: str, body: bytes) -> Any:
    (result,) = (
        b.stub()
        .SendMessage(
            broker_pb2.SendMessageRequest(
                messages=[common_pb2.Message(topic=topic, body=body, queue_id=0)]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        .results
    )
    return result


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


def test_killed_broker_leaves_the_routes_within_its_session_timeout(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)

    b.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: route_of(ns, "orders") is None,
        SESSION_MS / 1000 + EXPIRY_SLACK_S,
        "the SIGKILLed broker's session to expire and its route to go",
    )
    # Nameservers never drop a broker on their own, only ZooKeeper's expiry does: the server
    # heard from the broker at most a ping interval (1/3 of the session) before the kill.
    assert time.monotonic() - killed_at > SESSION_MS / 1000 * 2 / 3 - 0.5
    assert status(ns).brokers == 0
    assert znode_owner(zookeeper, zk_root, "broker-a") == 0


def test_clean_shutdown_leaves_the_routes_at_once(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    # The longest session the server grants (20 ticks): only the broker's own delete can take
    # the route away within the deadline below.
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root, session_ms=10_000)

    b.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: route_of(ns, "orders") is None, 5, "the route to go at shutdown")
    # Waited for, not signalled again: a second SIGTERM after asyncio has put the default
    # handler back would kill the process on its way out.
    assert b.proc.wait(timeout=10) == 0
    b.terminate()  # only closes the test's channel now
    assert "unregistered from ZooKeeper" in b.log()

    # Nothing of the old process is left in the way: it registers again at once.
    port = int(b.address.rsplit(":", 1)[1])
    again = start_zk_broker(start_broker, zookeeper, zk_root, session_ms=10_000, port=port)
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: again.address}},
        10,
        "the restarted broker's route",
    )


def test_routes_stay_while_zookeeper_is_down_and_turn_fresh_when_it_is_back(
    start_zookeeper: StartZooKeeper,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    zk = start_zookeeper()
    ns, b = routed_broker(start_nameserver, start_broker, zk, zk_root)
    wait_until(lambda: not status(ns).stale, 10, "the nameserver to be in sync")
    route_before = wire(query_route(ns, "orders"))
    info_before = wire(cluster_info(ns))

    zk.stop()
    wait_until(lambda: status(ns).stale, 10, "the nameserver to report its routes stale")
    s = status(ns)
    assert (s.registry, s.brokers) == ("zookeeper", 1)
    assert wire(query_route(ns, "orders")) == route_before
    assert wire(cluster_info(ns)) == info_before
    # The broker serves on without its registry.
    assert send_one(b, "orders", b"sent while ZooKeeper is down").status == broker_pb2.SEND_OK

    zk.start()  # same data and port: the broker's session and znode come back with it
    wait_until(lambda: not status(ns).stale, 20, "the nameserver to be in sync again")
    assert wire(query_route(ns, "orders")) == route_before
    assert send_one(b, "orders", b"sent after ZooKeeper is back").status == broker_pb2.SEND_OK


def test_broker_registers_again_after_its_session_expired(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)
    first_session = znode_owner(zookeeper, zk_root, "broker-a")
    assert first_session != 0

    # Frozen past its session timeout, the broker cannot ping: ZooKeeper expires the session
    # for real and deletes its znode. Woken up, kazoo finds the session expired (LOST) and opens
    # a new one; the broker must notice and register again by itself.
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: route_of(ns, "orders") is None,
            SESSION_MS / 1000 + EXPIRY_SLACK_S,
            "ZooKeeper to expire the frozen broker's session",
        )
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: b.address}},
        20,
        "the broker to register again under a new session",
    )
    assert znode_owner(zookeeper, zk_root, "broker-a") not in (0, first_session)
    assert "session expired" in b.log()


def test_restarted_broker_waits_for_its_old_session_then_registers(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)
    old_session = znode_owner(zookeeper, zk_root, "broker-a")

    # Restarted at once on the same store and port, the broker finds its znode still held by
    # the dead process's session: it must wait for that session to expire, then take over.
    b.kill()
    port = int(b.address.rsplit(":", 1)[1])
    again = start_zk_broker(start_broker, zookeeper, zk_root, port=port)
    wait_until(
        lambda: znode_owner(zookeeper, zk_root, "broker-a") not in (0, old_session),
        SESSION_MS / 1000 + EXPIRY_SLACK_S + 5,
        "the restarted broker to own the znode",
    )
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: again.address}},
        10,
        "the restarted broker's route",
    )
    assert f"held by ZooKeeper session 0x{old_session:x}" in again.log()


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
        f"{group}/broker-v/0": registration("broker-v", format=2),
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


def test_nameserver_starts_before_zookeeper_and_catches_up(
    start_zookeeper: StartZooKeeper,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    zk = start_zookeeper(run=False)
    ns = start_nameserver(*zk_flags(zk, zk_root))
    s = status(ns)
    assert (s.registry, s.stale) == ("zookeeper", True)
    assert "never read" in s.detail
    # Not NOT_FOUND: that would tell clients the topic does not exist.
    code, detail = typed_error(lambda: query_route(ns, "orders"))
    assert (code, detail.code, detail.retriable) == (
        grpc.StatusCode.UNAVAILABLE,
        common_pb2.ROUTE_NOT_FOUND,
        True,
    )

    zk.start()
    wait_until(lambda: not status(ns).stale, 20, "the nameserver to read ZooKeeper")
    b = start_zk_broker(start_broker, zk, zk_root)
    create_topic(b, "orders")
    wait_until(lambda: route_of(ns, "orders") == {"broker-a": {0: b.address}}, 20, "the route")


def test_slave_registered_only_in_zookeeper_finds_its_master_there(
    zookeeper: ZooKeeperServer, zk_root: str, start_broker: StartBroker
) -> None:
    master = start_zk_broker(start_broker, zookeeper, zk_root)
    master.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(topic=common_pb2.TopicConfig(topic="orders")),
        timeout=RPC_TIMEOUT_S,
    )
    slave = start_broker(
        "--broker-name",
        "broker-a",
        "--role",
        "SLAVE",
        "--broker-id",
        "1",
        "--config-sync-interval-ms",
        "300",
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
