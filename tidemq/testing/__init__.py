"""tidemq.testing: real tidemq in containers, for your own tests.

One container with a nameserver and a broker, for an application's tests::

    from tidemq.testing import TidemqContainer

    with TidemqContainer() as tidemq:
        with Producer(tidemq.get_nameserver_address()) as producer:
            producer.send("orders", b"order-1")

A whole cluster (ZooKeeper, nameservers, master/slave broker groups) for failover tests::

    from tidemq.testing import TidemqCluster

    with TidemqCluster(master_role="SYNC_MASTER", slaves=1) as cluster:
        with cluster.producer() as producer:
            producer.send("orders", b"kept")
        cluster.wait_synced()
        cluster.kill(cluster.master())
        with cluster.consumer("billing", "orders", start_from="first") as consumer:
            assert [m.body for m in consumer.poll(max_messages=1, timeout_s=10)] == [b"kept"]

Needs the ``testing`` extra (testcontainers) and a Docker-compatible engine (``DOCKER_HOST``)
that has the tidemq image (``docker/``; ``TIDEMQ_TEST_IMAGE`` names it) and, for a cluster, a
ZooKeeper image (``TIDEMQ_TEST_ZOOKEEPER_IMAGE``, default the official ``zookeeper:3.8``). See
docs/testing.md.

The names are imported on first use, so the image can run ``tidemq.testing.link_delay`` (a
cluster's latency faults) without testcontainers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidemq.testing.cluster import TidemqCluster, group_names
    from tidemq.testing.config import broker_toml
    from tidemq.testing.container import TidemqContainer
    from tidemq.testing.node import Kind, Node, wait_for, zookeeper_mode

_WHERE = {
    "Kind": "node",
    "Node": "node",
    "TidemqCluster": "cluster",
    "TidemqContainer": "container",
    "broker_toml": "config",
    "group_names": "cluster",
    "wait_for": "node",
    "zookeeper_mode": "node",
}

__all__ = [
    "Kind",
    "Node",
    "TidemqCluster",
    "TidemqContainer",
    "broker_toml",
    "group_names",
    "wait_for",
    "zookeeper_mode",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemq.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tidemq.testing.{module}"), name)
