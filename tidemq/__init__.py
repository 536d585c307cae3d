"""tidemq: a replicated message broker in the tradition of Apache RocketMQ.

The Python SDK::

    import tidemq

    with tidemq.Producer(nameserver="127.0.0.1:9876") as producer:
        producer.send("orders", b'{"id": 1}', tag="created", keys=["order-1"])

    with tidemq.Consumer(group="billing", topic="orders", start_from="first") as consumer:
        for message in consumer.poll(max_messages=10, timeout_s=2):
            print(message.body)

``AsyncProducer``, ``AsyncConsumer`` and ``AsyncAdmin`` are the asyncio versions. Errors are
``tidemq.errors.TidemqError`` subclasses carrying ``retriable``.
"""

from tidemq import errors
from tidemq.admin import Admin, AsyncAdmin, QueueStatus
from tidemq.consumer import AsyncConsumer, Consumer, ConsumerConfig
from tidemq.errors import TidemqError
from tidemq.producer import AsyncProducer, Producer, ProducerConfig
from tidemq.reader import AsyncQueueReader, PullResult, PullStatus, QueueReader
from tidemq.routes import MessageQueue
from tidemq.types import Message, ReceivedMessage, SendResult, SendStatus

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncQueueReader",
    "Consumer",
    "ConsumerConfig",
    "Message",
    "MessageQueue",
    "Producer",
    "ProducerConfig",
    "PullResult",
    "PullStatus",
    "QueueReader",
    "QueueStatus",
    "ReceivedMessage",
    "SendResult",
    "SendStatus",
    "TidemqError",
    "errors",
]
