"""SendMessage by record blocks (docs/sdk.md, "Record blocks on the wire"): one topic's
messages as CommitLog records the producer encoded, one block per queue; the store checks and
fills them and writes the request as one put. The answer says where each block went
(``BlockResult``), not where each message went: the producer derives each message's offsets and
id from it.

No per-message Python work here: a request of a thousand messages costs what a request of one
does, plus the compiled codec's copy and CRC.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker.admission_grpc import work_done
from tidemq.services.broker.convert import SEND_STATUS, peer_host
from tidemq.services.broker.handlers.checks import BrokerChecks
from tidemq.services.broker.idempotence.sends import BlockPlan, IdempotentSends
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.put_waits import MasterReplication
from tidemq.services.broker.topics import TopicConfig
from tidemq.services.errors import invalid
from tidemq.storage import BlockPutResult, MessageStore, SentBlock
from tidemq.storage.record import FIXED_OVERHEAD_V4

_TOTALSIZE = struct.Struct(">i")  # every record starts with its size


class BlockSends:
    def __init__(
        self,
        checks: BrokerChecks,
        store: MessageStore,
        writable_topic: Callable[[str], Awaitable[TopicConfig]],
        replication: MasterReplication | None,
        metrics: BrokerMetrics | None,
        idempotence: IdempotentSends,
    ) -> None:
        self.checks = checks
        self.config = checks.config
        self.store = store
        self.writable_topic = writable_topic
        self.replication = replication
        self.metrics = metrics
        self.idempotence = idempotence

    async def send(self, request: Any, context: grpc.aio.ServicerContext, started: float) -> Any:
        """The request's blocks stored as one put (its checks are SendMessage's, done)."""
        checks = self.checks
        if request.messages:
            raise invalid("a send carries messages or record blocks, not both")
        if request.transactional:
            raise invalid("record blocks cannot be transactional: send half messages one by one")
        topic = request.block_topic
        cfg = await self.writable_topic(topic)
        born = peer_host(context.peer())
        blocks = []
        total = 0
        for b in request.blocks:
            checks.check_queue(cfg, b.queue_id, for_write=True)
            if b.count <= 0:
                raise invalid(f"a block of queue {b.queue_id} holds {b.count} records")
            total += b.count
            blocks.append(SentBlock(topic, b.queue_id, b.records, b.count, born))
        if total > self.config.max_batch_messages:
            raise invalid(f"at most {self.config.max_batch_messages} messages per send")
        # Idempotent sends: what to store, what is a duplicate. Nothing may await from here
        # to the put.
        stored, plan = await self.idempotence.before_put_blocks(request, blocks)
        put = None
        if stored:
            start = self.store.log.max_offset
            put = self.store.put_blocks(stored)
            self.idempotence.after_put_blocks(plan, stored, put, start)
        work_done()  # what is left is waiting: the connection may run its next request
        status = await self.idempotence.answer_status(put, self.replication, checks)
        wire = SEND_STATUS[status]
        if self.metrics is not None:
            stored_count = sum(b.record_count for b in stored)
            body_bytes = put.body_bytes if put is not None else 0
            self.metrics.sent_blocks(
                topic, stored_count, body_bytes, broker_pb2.SendStatus.Name(wire), started
            )
        return self._answer(request, put, plan, wire)

    def _answer(
        self, request: Any, put: BlockPutResult | None, plan: BlockPlan | None, wire: int
    ) -> Any:
        response = broker_pb2.SendMessageResponse(
            broker_name=self.config.broker_name,
            epoch=self.checks.role.epoch,
            block_status=wire,
        )
        if put is not None:
            response.store_host, response.store_port = put.store_host
            response.store_timestamp_ms = put.store_timestamp_ms
        placements = iter(put.placements if put is not None else ())
        add = response.block_results.add
        decisions = plan.decisions if plan is not None else [None] * len(request.blocks)
        for b, original in zip(request.blocks, decisions, strict=True):
            if original is None:
                p = next(placements)
                add(
                    queue_id=p.queue_id,
                    count=p.record_count,
                    first_queue_offset=p.first_queue_offset,
                    first_commitlog_offset=p.first_phy_offset,
                    added_bytes=p.added_bytes,
                    head_added_bytes=p.head_added_bytes,
                    file_start_indexes=[i for i, _ in p.file_starts],
                    file_start_offsets=[at for _, at in p.file_starts],
                )
            else:
                self.idempotence.duplicates += b.count
                self._duplicate(
                    add(queue_id=b.queue_id, count=b.count, duplicate=True), b, original
                )
        if put is None and response.block_results:
            # Only duplicates: their records carry the store host they were stored with.
            response.store_host, response.store_port = self.store.config.store_host_packed
        return response

    def _duplicate(self, result: Any, block: Any, original: Any) -> None:
        """A block stored before, as a whole: where its records are, read from its queue, said
        in the placement's terms (any record not where the sizes put it is listed by itself)."""
        result.first_queue_offset = original.queue_offset
        result.first_commitlog_offset = -1
        if original.queue_offset < 0:
            return  # stored too long ago to be remembered
        entries = self.store.queue_entries(
            original.topic, original.queue_id, original.queue_offset, block.count
        )
        if len(entries) != block.count:
            result.first_queue_offset = -1  # retention took some of it
            return
        sent = _sent_sizes(block.records, block.count)
        if sent is None:
            result.first_queue_offset = -1  # not records: nothing to say where they went
            return
        added = entries[1].size - sent[1] if block.count > 1 else 0
        head = entries[0].size - sent[0] - added
        result.first_commitlog_offset = entries[0].phy_offset
        result.added_bytes, result.head_added_bytes = added, head
        predicted = entries[0].phy_offset
        for i, e in enumerate(entries):
            if e.phy_offset != predicted:
                result.file_start_indexes.append(i)
                result.file_start_offsets.append(e.phy_offset)
            predicted = e.phy_offset + e.size


def _sent_sizes(records: bytes, count: int) -> list[int] | None:
    """The sizes of a sent block's records, None when they do not add up (a duplicate's
    bytes are not checked: its first store was)."""
    sizes = []
    at = 0
    for _ in range(count):
        if len(records) - at < FIXED_OVERHEAD_V4:
            return None
        (size,) = _TOTALSIZE.unpack_from(records, at)
        if not FIXED_OVERHEAD_V4 <= size <= len(records) - at:
            return None
        sizes.append(size)
        at += size
    return sizes if at == len(records) else None
