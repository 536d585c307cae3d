"""Administration: ``AsyncAdmin`` (asyncio) and ``Admin`` (blocking) in ``admin``; the shape
of the cluster status they report in ``status``; consumer groups (settings, receive state) in
``consumer_groups``; dead-letter queues in ``dead_letters``."""

from tidemq.admin.admin import Admin, AsyncAdmin, QueueStatus
from tidemq.admin.consumer_groups import (
    ConsumerGroup,
    QueueReceiveState,
    ReceiveState,
    RetryPolicy,
)

__all__ = [
    "Admin",
    "AsyncAdmin",
    "ConsumerGroup",
    "QueueReceiveState",
    "QueueStatus",
    "ReceiveState",
    "RetryPolicy",
]
