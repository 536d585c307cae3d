"""Consumers: ``AsyncConsumer`` (asyncio) and ``Consumer`` (blocking).

- **Clustering** (default): the group's live members split the topic's queues among themselves
  (``allocate.allocate_averagely``); each member heartbeats to the brokers and re-reads the
  membership every ``rebalance_interval_ms``, so when members come and go the queues move.
  Offsets are committed to the broker that owns each queue.
- **Reading from slaves**: when a group's master fails a call (unreachable, timed out), the
  consumer reads that group's queues from its slaves, commits there, and tries the master again
  after ``master_retry_ms``. Its position is kept: a slave that has not yet replicated as far
  as the consumer got is waited for, never read from an older offset. After any move (or a
  failed pull) the broker must show it holds the newest records pulled (``lineage``); a
  failover that took them back rewinds the queue to where the logs agree.
- **Broadcasting**: every member reads every queue; offsets are kept in a local file per group
  and ``instance_name``, as RocketMQ's LocalFileOffsetStore.

Delivery is at least once. Each owned queue has a long-polling pull task filling a bounded
buffer; ``poll`` takes from the buffers. With ``auto_commit`` the offsets of what earlier
``poll`` calls returned are committed every ``auto_commit_interval_ms`` and at ``close``;
without it, ``commit()`` commits everything returned so far. A new group starts from the
``start_from`` position: ``"last"`` (only new messages), ``"first"``, or a timestamp in ms.

The modules: ``consumer`` (the API), ``membership`` (heartbeats, the member list, which queues
this member owns), ``pulling`` (a queue's state and its pull task), ``lineage`` (what a queue's
pulls read, checked after a move to another broker), ``offsets`` (commits and start
positions), ``brokers`` (which broker of a group to call: master or slave), ``config``.

Receive/ack consumption (RocketMQ 5's SimpleConsumer and PushConsumer; no queue is owned, the
brokers keep each message's delivery state): ``simple`` (``SimpleConsumer``), ``push``
(``PushConsumer``: listener, concurrency, shutdown), ``receive_calls`` (heartbeats with model
RECEIVE, receives from the masters in turn, acks to the current master of a message's broker
group), ``settling`` (acks and nacks per broker group, per-handle results), ``acks`` (ack
batching), ``renewal`` (when a running message's invisibility is renewed), ``receive_config``
(their settings).
"""

from tidemq.consumer.config import ConsumerConfig
from tidemq.consumer.consumer import AsyncConsumer, Consumer
from tidemq.consumer.push import AsyncPushConsumer, PushStats
from tidemq.consumer.push_blocking import PushConsumer
from tidemq.consumer.receive_config import PushConsumerConfig, SimpleConsumerConfig
from tidemq.consumer.simple import AsyncSimpleConsumer, SimpleConsumer

__all__ = [
    "AsyncConsumer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "Consumer",
    "ConsumerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "PushStats",
    "SimpleConsumer",
    "SimpleConsumerConfig",
]
