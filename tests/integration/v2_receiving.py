"""Helpers of the v2 (apache.rocketmq.v2) consumption tests: a broker with its v2 listener, and
the calls an official client makes, through our own generated stubs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2  # type: ignore[import-untyped]

from tests.integration.conftest import BrokerProcess, StartBroker
from tests.integration.receiving import FAST, GROUP, TOPIC
from tidemq.protos.rocketmq import definition_pb2 as d
from tidemq.protos.rocketmq import service_pb2, service_pb2_grpc

BROKER_NAME = "broker-a"  # the broker's default name
METADATA = (("x-mq-client-id", "tester@1@0@v2receive"), ("x-mq-protocol", "GRPC_V2"))


@dataclass
class V2Broker:
    broker: BrokerProcess
    address: str
    channel: grpc.Channel

    @property
    def stub(self) -> service_pb2_grpc.MessagingServiceStub:
        return service_pb2_grpc.MessagingServiceStub(self.channel)


def start_v2(start_broker: StartBroker, *flags: str) -> V2Broker:
    b = start_broker(*FAST, *flags, rocketmq=True)
    channel = grpc.insecure_channel(b.rocketmq_address)
    grpc.channel_ready_future(channel).result(timeout=20)
    return V2Broker(b, b.rocketmq_address, channel)


def seconds(s: float) -> duration_pb2.Duration:
    d_ = duration_pb2.Duration()
    d_.FromMilliseconds(int(s * 1000))
    return d_


def queue(topic: str = TOPIC, broker_name: str = BROKER_NAME) -> d.MessageQueue:
    return d.MessageQueue(
        topic=d.Resource(name=topic),
        id=0,
        permission=d.READ_WRITE,
        broker=d.Broker(name=broker_name, id=0),
    )


@dataclass
class Received:
    """A receive's stream, element by element, and how long it took."""

    elements: list[Any]
    elapsed_s: float

    @property
    def kinds(self) -> list[str]:
        return [str(e.WhichOneof("content")) for e in self.elements]

    @property
    def status(self) -> Any:
        return self.elements[0].status

    @property
    def code(self) -> str:
        return str(d.Code.Name(self.status.code))

    @property
    def messages(self) -> list[Any]:
        return [e.message for e in self.elements if e.WhichOneof("content") == "message"]


def receive(
    v2: V2Broker,
    *,
    invisible_s: float | None = 30,
    poll_s: float | None = 5,
    timeout_s: float = 10,
    batch: int = 32,
    group: str = GROUP,
    topic: str = TOPIC,
    tag: str | None = None,
    **kw: Any,
) -> Received:
    req = service_pb2.ReceiveMessageRequest(
        group=d.Resource(name=group),
        message_queue=kw.pop("message_queue", None) or queue(topic),
        batch_size=batch,
        **kw,
    )
    if invisible_s is not None:
        req.invisible_duration.CopyFrom(seconds(invisible_s))
    if poll_s is not None:
        req.long_polling_timeout.CopyFrom(seconds(poll_s))
    if tag is not None:
        req.filter_expression.CopyFrom(d.FilterExpression(type=d.TAG, expression=tag))
    started = time.monotonic()
    elements = list(v2.stub.ReceiveMessage(req, timeout=timeout_s, metadata=METADATA))
    return Received(elements, time.monotonic() - started)


def receive_until(v2: V2Broker, count: int, timeout_s: float = 20, **kw: Any) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(got)} of {count} within {timeout_s}s")
        r = receive(v2, **kw)
        assert r.code in ("OK", "MESSAGE_NOT_FOUND"), r.status
        got += r.messages
    return got


def ack(
    v2: V2Broker, messages: Sequence[Any], group: str = GROUP, topic: str = TOPIC
) -> service_pb2.AckMessageResponse:
    return v2.stub.AckMessage(
        service_pb2.AckMessageRequest(
            group=d.Resource(name=group),
            topic=d.Resource(name=topic),
            entries=[
                service_pb2.AckMessageEntry(
                    message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle,
                )
                for m in messages
            ],
        ),
        timeout=10,
        metadata=METADATA,
    )


def change(
    v2: V2Broker, message: Any, invisible_s: float, handle: str | None = None
) -> service_pb2.ChangeInvisibleDurationResponse:
    return v2.stub.ChangeInvisibleDuration(
        service_pb2.ChangeInvisibleDurationRequest(
            group=d.Resource(name=GROUP),
            topic=d.Resource(name=TOPIC),
            receipt_handle=handle or message.system_properties.receipt_handle,
            invisible_duration=seconds(invisible_s),
            message_id=message.system_properties.message_id,
        ),
        timeout=10,
        metadata=METADATA,
    )


def name(code: int) -> str:
    return str(d.Code.Name(code))
