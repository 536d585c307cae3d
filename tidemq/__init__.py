"""tidemq: a replicated message broker in the tradition of Apache RocketMQ.

The Python SDK::

    import tidemq

    with tidemq.Producer(nameserver="127.0.0.1:9876") as producer:
        producer.send("orders", b'{"id": 1}', tag="created", keys=["order-1"])

    with tidemq.Consumer(group="billing", topic="orders", start_from="first") as consumer:
        for message in consumer.poll(max_messages=10, timeout_s=2):
            print(message.body)

Receive/ack consumption (each message acked on its own, retried with backoff, dead-lettered
after the group's max attempts)::

    with tidemq.SimpleConsumer("billing", "orders") as consumer:
        for message in consumer.receive(max_messages=16, invisible_duration_s=30):
            consumer.ack(message)

``PushConsumer`` calls a listener that answers ``tidemq.ConsumeResult.SUCCESS`` or ``FAILURE``.
``AsyncProducer``, ``AsyncConsumer``, ``AsyncSimpleConsumer``, ``AsyncPushConsumer`` and
``AsyncAdmin`` are the asyncio versions. Errors are
``tidemq.errors.TidemqError`` subclasses carrying ``retriable``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidemq import errors
    from tidemq.admin import Admin, AsyncAdmin, QueueStatus
    from tidemq.consumer import (
        AsyncConsumer,
        AsyncPushConsumer,
        AsyncSimpleConsumer,
        Consumer,
        ConsumerConfig,
        PushConsumer,
        PushConsumerConfig,
        SimpleConsumer,
        SimpleConsumerConfig,
    )
    from tidemq.errors import TidemqError
    from tidemq.metrics import ClientMetrics
    from tidemq.producer import (
        AsyncProducer,
        AsyncTransaction,
        AsyncTransactionChecker,
        Producer,
        ProducerConfig,
        Transaction,
        TransactionChecker,
        TransactionResolution,
    )
    from tidemq.protos.signing import Credentials
    from tidemq.protos.tls import TlsSettings
    from tidemq.reader import AsyncQueueReader, PullResult, PullStatus, QueueReader
    from tidemq.routes import MessageQueue
    from tidemq.types import ConsumeResult, Message, ReceivedMessage, SendResult, SendStatus

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncPushConsumer",
    "AsyncQueueReader",
    "AsyncSimpleConsumer",
    "AsyncTransaction",
    "AsyncTransactionChecker",
    "ClientMetrics",
    "ConsumeResult",
    "Consumer",
    "ConsumerConfig",
    "Credentials",
    "Message",
    "MessageQueue",
    "Producer",
    "ProducerConfig",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "QueueReader",
    "QueueStatus",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "SimpleConsumerConfig",
    "TidemqError",
    "TlsSettings",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
    "errors",
]

# The SDK's names are loaded on first use (PEP 562): the server packages live in this namespace
# too (tidemq.storage, tidemq.services, ...), and a broker, or the store's index helper process,
# that imports them must not load the SDK and gRPC's client side with them.
_HOMES = {
    "Admin": "tidemq.admin",
    "AsyncAdmin": "tidemq.admin",
    "QueueStatus": "tidemq.admin",
    "AsyncConsumer": "tidemq.consumer",
    "Consumer": "tidemq.consumer",
    "ConsumerConfig": "tidemq.consumer",
    "AsyncPushConsumer": "tidemq.consumer",
    "AsyncSimpleConsumer": "tidemq.consumer",
    "PushConsumer": "tidemq.consumer",
    "PushConsumerConfig": "tidemq.consumer",
    "SimpleConsumer": "tidemq.consumer",
    "SimpleConsumerConfig": "tidemq.consumer",
    "TidemqError": "tidemq.errors",
    "ClientMetrics": "tidemq.metrics",
    "AsyncProducer": "tidemq.producer",
    "Producer": "tidemq.producer",
    "ProducerConfig": "tidemq.producer",
    "AsyncTransaction": "tidemq.producer",
    "AsyncTransactionChecker": "tidemq.producer",
    "Transaction": "tidemq.producer",
    "TransactionChecker": "tidemq.producer",
    "TransactionResolution": "tidemq.producer",
    "AsyncQueueReader": "tidemq.reader",
    "PullResult": "tidemq.reader",
    "PullStatus": "tidemq.reader",
    "QueueReader": "tidemq.reader",
    "MessageQueue": "tidemq.routes",
    "TlsSettings": "tidemq.protos.tls",
    "Credentials": "tidemq.protos.signing",
    "ConsumeResult": "tidemq.types",
    "Message": "tidemq.types",
    "ReceivedMessage": "tidemq.types",
    "SendResult": "tidemq.types",
    "SendStatus": "tidemq.types",
}


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("tidemq.errors")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
