"""Helpers of the receive/ack broker tests: raw gRPC calls of the receive API and their typed
errors, over real broker processes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import BrokerProcess
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import detail_from_metadata

GROUP = "workers"
TOPIC = "jobs"
# Short invisible times keep the tests fast; the broker's floor is lowered to allow them.
FAST = ("--receive-min-invisible-ms", "50", "--revive-interval-ms", "100")


def create_topic(b: BrokerProcess, topic: str = TOPIC, queues: int = 1) -> None:
    b.stub().CreateTopic(
        broker_pb2.CreateTopicRequest(
            topic=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues
            )
        ),
        timeout=10,
    )


def send(b: BrokerProcess, bodies: Sequence[bytes], topic: str = TOPIC, queue_id: int = 0) -> None:
    msgs = [
        common_pb2.Message(topic=topic, body=x, queue_id=queue_id, keys=[x.decode()])
        for x in bodies
    ]
    r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
    assert {x.status for x in r.results} == {broker_pb2.SEND_OK}


def set_group(b: BrokerProcess, group: str = GROUP, **settings: Any) -> None:
    """UpdateConsumerGroup: e.g. max_delivery_attempts=2, delays_ms=[200]."""
    delays = settings.pop("delays_ms", None)
    req = broker_pb2.UpdateConsumerGroupRequest(group=group, model=broker_pb2.RECEIVE, **settings)
    if delays is not None:
        req.retry_policy.CopyFrom(broker_pb2.RetryPolicy(delays_ms=delays))
    b.stub().UpdateConsumerGroup(req, timeout=10)


def receive(
    b: BrokerProcess,
    *,
    max_messages: int = 32,
    invisible_ms: int = 30_000,
    wait_ms: int = 0,
    group: str = GROUP,
    topic: str = TOPIC,
    queue_id: int = -1,
    **kw: Any,
) -> list[Any]:
    r = b.stub().ReceiveMessage(
        broker_pb2.ReceiveMessageRequest(
            group=group,
            topic=topic,
            queue_id=queue_id,
            max_messages=max_messages,
            invisible_duration_ms=invisible_ms,
            long_poll_timeout_ms=wait_ms,
            start_from=kw.pop("start_from", "first"),
            **kw,
        ),
        timeout=30,
    )
    return list(r.messages)


def receive_until(b: BrokerProcess, count: int, timeout_s: float = 20, **kw: Any) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"received {len(got)} of {count} within {timeout_s}s")
        got += receive(b, wait_ms=int(min(left, 5) * 1000), **kw)
    return got


def ack(
    b: BrokerProcess, handles: Sequence[str], group: str = GROUP, topic: str = TOPIC
) -> list[Any]:
    r = b.stub().AckMessage(
        broker_pb2.AckMessageRequest(group=group, topic=topic, receipt_handles=handles), timeout=30
    )
    return list(r.results)


def nack(
    b: BrokerProcess, handles: Sequence[str], group: str = GROUP, topic: str = TOPIC
) -> list[Any]:
    r = b.stub().NackMessage(
        broker_pb2.NackMessageRequest(group=group, topic=topic, receipt_handles=handles), timeout=30
    )
    return list(r.results)


def change(b: BrokerProcess, handle: str, invisible_ms: int, group: str = GROUP) -> Any:
    return b.stub().ChangeInvisibleDuration(
        broker_pb2.ChangeInvisibleDurationRequest(
            group=group, topic=TOPIC, receipt_handle=handle, invisible_duration_ms=invisible_ms
        ),
        timeout=30,
    )


def state(b: BrokerProcess, group: str = GROUP) -> Any:
    return b.stub().GetReceiveState(broker_pb2.GetReceiveStateRequest(group=group), timeout=10)


def codes(results: Sequence[Any]) -> list[str]:
    """Each HandleResult's outcome: "OK" or its ErrorCode name."""
    return [
        common_pb2.ErrorCode.Name(r.error.code) if r.HasField("error") else "OK" for r in results
    ]


def error_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, bool]:
    try:
        call()
    except grpc.RpcError as e:
        detail = detail_from_metadata(e.trailing_metadata())
        assert detail is not None, "every error carries its typed detail"
        return e.code(), common_pb2.ErrorCode.Name(detail.code), detail.retriable
    raise AssertionError("the call succeeded")


def bodies(messages: Sequence[Any]) -> list[bytes]:
    return sorted(m.message.body for m in messages)


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a broker's /metrics, by name and sorted labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
