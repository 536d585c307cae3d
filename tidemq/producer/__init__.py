"""Producers: ``AsyncProducer`` (asyncio) and ``Producer`` (blocking, runs an AsyncProducer on a
background loop).

How a send travels (``producer`` -> ``accumulator`` -> ``sender``):
- **Queue selection** (``routing``): round robin over the topic's writable queues, skipping
  broker groups that just failed or answered slowly (``fault.LatencyFaultTolerance``); or, with
  a ``message_group`` (``sharding_key``, its older name), always the same queue for the same
  group (CRC32 of it over the sorted queue list), so one consumer sees that group's messages in
  order; the group travels as the ``__SHARDINGKEY`` property (FIFO receive groups use it).
- **Record blocks** (``blocks``): a plain message (no message group, no delayed delivery, not
  transactional) joins its topic's open block in the caller's thread; a sealed block is placed
  on one queue (round robin by block, skipping failing groups), encoded once as the CommitLog
  records the broker stores and sent as one ``bytes`` field; its answer says where the block
  went and every message's result is derived from it. ``record_blocks=False`` sends plain
  messages as the others go, for brokers older than blocks.
- **Automatic batching** (``accumulator``): the other messages for one broker group collect in
  an open batch. It is sent when it is full (``batch_max_messages`` / ``batch_max_bytes``), when
  ``linger_ms`` has passed, or, with ``linger_ms=0``, as soon as fewer than
  ``max_in_flight_per_broker`` requests are outstanding. So a lone send goes at once, and under
  load sends coalesce into large RPCs while earlier ones are in flight.
- **Retries** (``sender``, tenacity): only errors marked retriable, within ``send_timeout_ms``
  in total and at most ``retries`` more attempts. A retry refreshes the route and moves
  messages without a sharding key to another broker group; keyed messages keep their queue.
- **Transactions** (``transactions``, ``transaction_sends``): ``begin_transaction()`` sends
  half messages straight to a queue's master (not batched), ends them with EndTransaction, and
  answers the broker's checks through the producer's ``transaction_checker``.
- **Answers** (``futures``): every accepted message is answered exactly once; the blocking
  API's ``SendFuture`` wakes its waiters once per response, not once per message.
"""

from tidemq.producer.blocking import Producer
from tidemq.producer.config import ProducerConfig, ProducerStats
from tidemq.producer.futures import SendFuture
from tidemq.producer.producer import AsyncProducer
from tidemq.producer.transactions import (
    AsyncTransaction,
    AsyncTransactionChecker,
    Transaction,
    TransactionChecker,
    TransactionResolution,
)

__all__ = [
    "AsyncProducer",
    "AsyncTransaction",
    "AsyncTransactionChecker",
    "Producer",
    "ProducerConfig",
    "ProducerStats",
    "SendFuture",
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
]
