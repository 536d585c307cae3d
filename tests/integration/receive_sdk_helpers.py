"""Shared parts of the receive SDK's integration tests: a one-broker cluster fixture and
helpers to make a topic, send and receive."""

from __future__ import annotations

import asyncio
import time

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.test_sdk import Cluster, _routable, broker_flags

FAST = tidemq.SimpleConsumerConfig(start_from="first", heartbeat_interval_ms=500)


@pytest.fixture(name="cluster")
def cluster_fixture(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    ns = start_nameserver()
    b = start_broker(*broker_flags(ns, "broker-a"), store="broker-a")
    c = Cluster(ns, {"broker-a": b}, start_broker)
    _routable(c.address)
    return c


def _topic(
    cluster: Cluster, topic: str, group: str, *, delays_s: list[float], attempts: int = 16
) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic(topic, queues=2)
        admin.update_consumer_group(group, retry_delays_s=delays_s, max_delivery_attempts=attempts)


def _send(
    cluster: Cluster, topic: str, bodies: list[str], **kwargs: object
) -> list[tidemq.SendResult]:
    with tidemq.Producer(cluster.address) as producer:
        results = [producer.send(topic, b, **kwargs) for b in bodies]  # type: ignore[arg-type]
    assert all(r.ok for r in results)
    return results


def _receive_n(
    consumer: tidemq.SimpleConsumer, n: int, invisible_s: float, timeout_s: float = 20
) -> list[tidemq.ReceivedMessage]:
    got: list[tidemq.ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive(n - len(got), invisible_s, timeout_s=1.0)
    return got


async def _acked(consumer: tidemq.AsyncPushConsumer, n: int) -> None:
    while consumer.stats.acked < n:  # noqa: ASYNC110 - the stats have no event to wait on
        await asyncio.sleep(0.01)
