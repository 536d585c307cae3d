"""The ZooKeeper registry at scale (issue 27), with real processes: a broker holding 20,000 topics
registers (its topics in shard znodes, none near ZooKeeper's size limit), two nameservers route
them, a topic created then is routable through both within 1 s, and a SIGKILLed broker's routes
all leave within its session timeout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.zk_registry import (
    CLUSTER,
    EXPIRY_SLACK_S,
    SESSION_MS,
    route_of,
    start_zk_broker,
    status,
    zk_flags,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.admin import Admin
from tidemq.services.nameserver import zk_format

pytestmark = pytest.mark.integration

TOPICS = 20_000
ROUTABLE_WITHIN_S = 1.0


def seed_topics(store: Path, count: int) -> None:
    """The broker's topic table before it starts, as TopicsFile writes it."""
    (store / "config").mkdir(parents=True)
    doc = {
        "topics": [
            {"topic": f"scale-{n:06d}", "read_queue_nums": 4, "write_queue_nums": 4, "perm": 6}
            for n in range(count)
        ],
        "data_version": {"state_version": 0, "counter": count, "timestamp_ms": 0},
    }
    (store / "config" / "topics.json").write_text(json.dumps(doc))


def test_a_broker_with_20k_topics_registers_and_new_topics_route_within_a_second(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    seed_topics(tmp_path / "broker-a", TOPICS)
    nameservers = [start_nameserver(*zk_flags(zookeeper, zk_root)) for _ in range(2)]
    b = start_zk_broker(start_broker, zookeeper, zk_root, "broker-a")
    sample = [f"scale-{n:06d}" for n in range(0, TOPICS, 997)]
    want = {"broker-a": {0: b.address}}
    wait_until(
        lambda: all(route_of(ns, t) == want for ns in nameservers for t in sample),
        60,
        "both nameservers to route the sample of the 20,000 topics",
    )
    # The topics are in shards, each far from the znode limit; the leaf holds none.
    shard_dir = zk_format.shard_dir(zk_root, CLUSTER, "broker-a", 0)
    with zookeeper.client() as client:
        shards = client.get_children(shard_dir)
        sizes = [client.get(f"{shard_dir}/{s}")[1].dataLength for s in shards]
        leaf, _ = client.get(zk_format.node_path(zk_root, CLUSTER, "broker-a", 0))
    assert len(shards) == zk_format.SHARDS
    assert max(sizes) < zk_format.MAX_DATA_BYTES // 10, max(sizes)
    assert b'"format":2' in leaf and b"topics" not in leaf

    with Admin(nameserver=[ns.address for ns in nameservers]) as admin:
        started = time.monotonic()
        admin.create_topic("scale-new", queues=2, wait=False)
        wait_until(
            lambda: all(route_of(ns, "scale-new") == want for ns in nameservers),
            10,
            "both nameservers to route the new topic",
        )
        took_s = time.monotonic() - started
    print(f"a topic created on a broker with {TOPICS} topics was routable in {took_s:.3f} s")
    assert took_s <= ROUTABLE_WITHIN_S, took_s
    for ns in nameservers:
        assert not status(ns).stale

    killed = time.monotonic()
    b.kill()

    def gone() -> bool:
        return all(
            route_of(ns, t) is None for ns in nameservers for t in [*sample, "scale-new"]
        ) and all(status(ns).brokers == 0 for ns in nameservers)

    wait_until(gone, SESSION_MS / 1000 + EXPIRY_SLACK_S, "every route of the killed broker to go")
    print(f"the killed broker's routes left in {time.monotonic() - killed:.2f} s")
