"""The SDK's metrics without a broker: what one SendMessage answer, a retry and a failure add
(``producer.metering``, ``futures.Unanswered``), what ack and nack results add, and that a
client built without metrics never loads prometheus_client."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from tidemq.errors import TidemqError
from tidemq.metrics import ClientMetrics
from tidemq.producer.futures import Unanswered
from tidemq.producer.metering import record_answer, record_retry
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.unit

TIMEOUT_S = 10.0


def metrics() -> tuple[ClientMetrics, CollectorRegistry]:
    r = CollectorRegistry()
    return ClientMetrics(r), r


def item(topic: str, count: int, accepted_s_ago: float):  # type: ignore[no-untyped-def]
    """A block or message as the sender holds it: topic, messages, deadline (monotonic)."""
    deadline = time.monotonic() - accepted_s_ago + TIMEOUT_S
    return SimpleNamespace(topic=topic, count=count, deadline=deadline)


def test_a_block_answer_counts_its_messages_once_per_topic_with_its_oldest_messages_latency() -> (
    None
):
    m, r = metrics()
    blocks = [item("orders", 1000, 0.2), item("orders", 24, 0.05)]
    resp = SimpleNamespace(block_status=broker_pb2.SEND_OK, results=[])
    record_answer(m, blocks, [], resp, TIMEOUT_S)
    sends = r.get_sample_value("tidemq_client_sends_total", {"topic": "orders", "outcome": "ok"})
    assert sends == 1024
    labels = {"topic": "orders"}
    assert r.get_sample_value("tidemq_client_send_latency_seconds_count", labels) == 1
    latency = r.get_sample_value("tidemq_client_send_latency_seconds_sum", labels)
    assert latency is not None and 0.2 <= latency < 5


def test_messages_of_one_request_count_by_their_own_status_and_topic() -> None:
    m, r = metrics()
    messages = [item("orders", 1, 0.0), item("orders", 1, 0.0), item("audit", 1, 0.0)]
    resp = SimpleNamespace(
        results=[
            SimpleNamespace(status=broker_pb2.SEND_OK),
            SimpleNamespace(status=broker_pb2.FLUSH_SLAVE_TIMEOUT),
            SimpleNamespace(status=broker_pb2.SEND_OK),
        ]
    )
    record_answer(m, [], messages, resp, TIMEOUT_S)

    def sends(topic: str, outcome: str) -> float | None:
        return r.get_sample_value("tidemq_client_sends_total", {"topic": topic, "outcome": outcome})

    assert sends("orders", "ok") == 1
    assert sends("orders", "flush_slave_timeout") == 1
    assert sends("audit", "ok") == 1
    count = "tidemq_client_send_latency_seconds_count"
    assert r.get_sample_value(count, {"topic": "orders"}) == 1  # one per request and topic
    assert r.get_sample_value(count, {"topic": "audit"}) == 1


def test_retries_count_messages_and_failures_count_wherever_they_happen() -> None:
    m, r = metrics()
    record_retry(m, [item("orders", 300, 0.0), item("orders", 1, 0.0)])
    assert r.get_sample_value("tidemq_client_send_retries_total", {"topic": "orders"}) == 301

    async def fail_one() -> None:
        unanswered = Unanswered(m)
        unanswered.expect(5)
        failed = SimpleNamespace(topic="orders", count=5, fail=lambda error: None)
        unanswered.fail(failed, TidemqError("no route", code="TOPIC_NOT_FOUND"))  # type: ignore[arg-type]

    asyncio.run(fail_one())
    failed = r.get_sample_value(
        "tidemq_client_sends_total", {"topic": "orders", "outcome": "failed"}
    )
    assert failed == 5


def test_ack_and_nack_results_count_ok_and_failed_per_message() -> None:
    m, r = metrics()
    expired = TidemqError("expired", code="RECEIPT_HANDLE_EXPIRED")
    m.settled("ack", "orders", "billing", [None, None, expired])
    m.settled("nack", "orders", "billing", [None])

    def get(name: str, outcome: str) -> float | None:
        labels = {"topic": "orders", "group": "billing", "outcome": outcome}
        return r.get_sample_value(name, labels)

    assert get("tidemq_client_acks_total", "ok") == 2
    assert get("tidemq_client_acks_total", "failed") == 1
    assert get("tidemq_client_nacks_total", "ok") == 1
    assert get("tidemq_client_nacks_total", "failed") is None


def test_the_sdk_without_metrics_never_imports_prometheus_client() -> None:
    code = (
        "import sys, tidemq, tidemq.metrics, tidemq.producer.sender, tidemq.consumer;"
        "print('prometheus_client' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
