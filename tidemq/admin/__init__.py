"""Administration: ``AsyncAdmin`` (asyncio) and ``Admin`` (blocking) in ``admin``; the shape
of the cluster status they report in ``status``; consumer groups (settings, receive state) in
``consumer_groups``; dead-letter queues in ``dead_letters``; pending delayed messages in
``delayed``; messages by id, key or time and their history in ``messages``; open
transactions in ``transactions``."""

from tidemq.admin.admin import Admin, AsyncAdmin, QueueStatus
from tidemq.admin.consumer_groups import (
    ConsumerGroup,
    QueueReceiveState,
    ReceiveState,
    RetryPolicy,
)
from tidemq.admin.delayed import DelayedMessage, DelayedMessages
from tidemq.admin.messages import (
    GroupOutcome,
    MessageEvent,
    MessageEventKind,
    MessageHistory,
)
from tidemq.admin.transactions import OpenTransaction, OpenTransactions

__all__ = [
    "Admin",
    "AsyncAdmin",
    "ConsumerGroup",
    "DelayedMessage",
    "DelayedMessages",
    "GroupOutcome",
    "MessageEvent",
    "MessageEventKind",
    "MessageHistory",
    "OpenTransaction",
    "OpenTransactions",
    "QueueReceiveState",
    "QueueStatus",
    "ReceiveState",
    "RetryPolicy",
]
