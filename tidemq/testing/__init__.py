"""tidemq.testing: a real tidemq cluster in containers, for your own failover tests.

::

    from tidemq.testing import TidemqCluster

    with TidemqCluster(master_role="SYNC_MASTER", slaves=1) as cluster:
        with cluster.producer() as producer:
            producer.send("orders", b"kept")
        cluster.wait_synced()
        cluster.kill(cluster.master())
        with cluster.consumer("billing", "orders", start_from="first") as consumer:
            assert [m.body for m in consumer.poll(max_messages=1, timeout_s=10)] == [b"kept"]

Needs the ``testing`` extra (testcontainers) and a Docker-compatible engine (``DOCKER_HOST``)
that has the tidemq image (``docker/``; ``TIDEMQ_TEST_IMAGE`` names it) and a ZooKeeper image
(``TIDEMQ_TEST_ZOOKEEPER_IMAGE``, default the official ``zookeeper:3.8``). See
docs/deployment.md.
"""

from tidemq.testing.cluster import TidemqCluster, group_names
from tidemq.testing.config import broker_toml
from tidemq.testing.node import Kind, Node, wait_for, zookeeper_mode

__all__ = [
    "Kind",
    "Node",
    "TidemqCluster",
    "broker_toml",
    "group_names",
    "wait_for",
    "zookeeper_mode",
]
